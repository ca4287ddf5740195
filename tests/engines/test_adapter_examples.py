"""The adapter page's example adapters (docs/adapters.md), run as the page says, and the page's
promise that an installed wheel judges an engine with no checkout."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adapters.md"


INSTALL_COMMAND = "infer-ref conformance --engine examples.engine_adapter_ids:start"  # the page's, with no checkout


def _page_commands() -> list[list[str]]:
    """The page's commands run from a checkout (on a fixture checkpoint)."""
    return [shlex.split(line) for line in PAGE.read_text().splitlines()
            if line.startswith("infer-ref conformance --engine examples.") and line != INSTALL_COMMAND]  # fmt: skip


def test_the_page_shows_both_example_adapters() -> None:
    engines = [words[3] for words in _page_commands()]
    assert engines == ["examples.engine_adapter_ids:start", "examples.engine_adapter_text:start"]
    for engine in engines:
        assert (ROOT / (engine.split(":")[0].replace(".", "/") + ".py")).is_file(), engine


def _conformance(words: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    report = cwd / "report.json"
    # -P: the working directory is not put on the path by Python (as under the console script)
    cmd = [sys.executable, "-P", "-m", "infer_ref.cli", *words[1:], "--report", str(report)]
    done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    return done, json.loads(report.read_text()) if report.is_file() else {}


@pytest.mark.kit_run
@pytest.mark.parametrize("words", _page_commands(), ids=lambda w: w[3].split(".")[1].split(":")[0])
def test_each_example_adapter_is_judged_and_conforms(words: list[str]) -> None:
    done, report = _conformance(words, ROOT, {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    counts = report["totals"]["counts"]
    assert counts["failed"] == 0 and counts["passed"] >= 5, counts
    assert report["verdict"] == "within the float32 tolerances", report["verdict"]


@pytest.mark.kit_run
def test_a_wheel_installed_kit_judges_an_example_adapter_outside_a_checkout(tmp_path: Path) -> None:
    """The wheel alone (its fixture checkpoints in the install's data folder), a user's adapter copied
    from the page, no --model-dir: the kit's checkpoints are found and the engine ones written on
    first use, with a progress line each."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)  # fmt: skip
    [wheel] = (tmp_path / "dist").glob("infer_ref-*.whl")
    # --target, not --prefix: pip would first uninstall the infer_ref of the running environment
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    run = tmp_path / "team"  # the page: the examples copied into examples/ of the folder the command runs in
    (run / "examples").mkdir(parents=True)
    for name in ("toy_engine.py", "engine_adapter_ids.py"):
        shutil.copy(ROOT / "examples" / name, run / "examples" / name)
    env = {"PYTHONPATH": str(site), "INFER_REF_ENGINE_CHECKPOINTS": str(tmp_path / "engine-checkpoints")}
    where = subprocess.run([sys.executable, "-c", "import infer_ref.paths as p; print(p.__file__); print(p.FIXTURE_CHECKPOINTS)"],
                           cwd=run, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert where == [str(site / "infer_ref" / "paths.py"), str(site / "share" / "infer_ref" / "checkpoints")]
    assert INSTALL_COMMAND in PAGE.read_text().splitlines()
    done, report = _conformance([*shlex.split(INSTALL_COMMAND), "-k", "test_max_tokens_exact"], run, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "infer_ref: writing engine checkpoint 1 of" in done.stderr, done.stderr[-2000:]
    assert {"llama-tiny", "qwen3-tiny", "gemma3-tiny"} <= set(report["by_family"]), report["by_family"]
    assert len(report["by_family"]) > 3 and report["totals"]["counts"]["failed"] == 0, report["totals"]


@pytest.mark.kit_run
def test_the_pages_endpoint_command_judges_a_running_server(tmp_path: Path) -> None:
    """The page's ``--endpoint`` line as written, pointed at a running server (the tests' stub, whose
    stated answers keep the API's own promises) and the folder it serves."""
    from openai_stub import Stub, StubServer

    [line] = [shlex.split(line.partition("#")[0]) for line in PAGE.read_text().splitlines()
              if line.startswith("infer-ref conformance --endpoint ")]  # fmt: skip
    with StubServer(Stub(extras=True)) as url:
        served = str(ROOT / "fixtures" / "checkpoints" / "llama-tiny")
        words = [url if w.startswith("http://") else served if w == "DIR" else w for w in line]
        done, report = _conformance([*words, "-k", "test_max_tokens_exact"], tmp_path, {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert report["totals"]["counts"]["passed"] >= 3 and report["impl"].startswith(f"--ir-endpoint={url}"), report["totals"]
