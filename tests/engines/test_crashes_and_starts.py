"""An engine that raises while answering fails with a repro script like any other failure (old: a
traceback only); every folder whose engine did not start is named in the report (old: the first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.errors import EXIT_NOT_JUDGED

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FIXTURES = ROOT / "fixtures" / "checkpoints"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}


def _conformance(engine: str, tmp_path: Path, *dirs: str, command: tuple[str, ...] = ("infer_ref.cli", "conformance")) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    report = tmp_path / "r.json"
    if command[0] == "pytest":  # the tier's own options (the command refuses an engine that never starts)
        selects = ["--pyargs", "infer_ref.conformance.engines.tests", f"--ir-engine={engine}", f"--ir-report={report}",
                   *(f"--ir-model-dir={FIXTURES / d}" for d in dirs)]  # fmt: skip
    else:
        selects = ["--engine", engine, "--report", str(report), *(f"--model-dir={FIXTURES / d}" for d in dirs)]
    cmd = [sys.executable, "-m", *command, *selects, "-k", "test_batch_matches_alone"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "INFER_REF_REPRO_DIR": str(tmp_path / "repros")},
                          cwd=tmp_path, timeout=600)  # fmt: skip
    return done, json.loads(report.read_text()) if report.is_file() else {}


@pytest.mark.kit_run
def test_a_crash_while_answering_fails_with_a_repro_script_that_crashes_the_same_way(tmp_path: Path) -> None:
    done, report = _conformance("crashing_engines:crashes", tmp_path, "llama-tiny")
    assert report["totals"]["counts"]["failed"] == 1, done.stdout[-3000:]
    first = report["totals"]["first_failure"]
    assert first.startswith("python ") and first.endswith(".py"), first
    script = Path(first.removeprefix("python "))
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300)
    # the batch of test_batch_matches_alone: 10 boundary prompts and 5 sharing a prefix
    assert again.returncode != 0 and "RuntimeError: illegal memory access in a batch of 15" in again.stderr, again.stderr[-2000:]


@pytest.mark.kit_run
def test_every_folder_whose_engine_did_not_start_is_named(tmp_path: Path) -> None:
    done, report = _conformance("crashing_engines:never_starts", tmp_path, "llama-tiny", "qwen3-tiny", command=("pytest",))
    assert done.returncode == EXIT_NOT_JUDGED, done.stdout[-3000:]
    reasons = report["not_judged_reasons"]
    assert len(reasons) == 2 and "no kernel for llama-tiny" in reasons[0] and "no kernel for qwen3-tiny" in reasons[1], reasons
    assert report["not_judged"] == reasons[0]
    assert report["capabilities"]["batch"] is None and report["capabilities"]["prefix_caching"] == "not declared", report["capabilities"]


def test_the_command_refuses_an_engine_that_starts_on_no_folder_in_one_line(tmp_path: Path) -> None:
    done, report = _conformance("crashing_engines:never_starts", tmp_path, "llama-tiny", "qwen3-tiny")
    assert done.returncode == EXIT_NOT_JUDGED and report == {} and done.stdout == "", done.stdout[-3000:]
    assert done.stderr.splitlines() == [
        f"infer-ref: error: crashing_engines:never_starts could not start on {FIXTURES / 'llama-tiny'} (stressed): "
        "RuntimeError: no kernel for llama-tiny (and on the 1 other checkpoint folders)"
    ], done.stderr[-3000:]
