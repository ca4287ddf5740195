"""An engine that could not be started or reached judges nothing: its tests are "not judged", the
verdict says "nothing judged" and the exit status is 7 — never "wrong" (old: a closed port gave 17
FAILED, a traceback, verdict **wrong**, exit 1, like a non-conforming engine)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from infer_ref.cli.conformance import conformance_exit_status
from infer_ref.conformance.engines.matrix.grid import Cell
from infer_ref.conformance.engines.matrix.results import outcome_of as junit_outcome
from infer_ref.conformance.plugin import engine_tier_header
from infer_ref.conformance.report import (
    NOT_JUDGED,
    NOTHING_JUDGED,
    PARTLY_JUDGED,
    Report,
    Tally,
    outcome_of,
    verdict_of,
)
from infer_ref.errors import EXIT_NOT_JUDGED, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"


def _skipped(reason: str) -> pytest.TestReport:
    return pytest.TestReport("t.py::test_x[llama-tiny]", ("t.py", 1, "test_x"), {}, "skipped",
                             ("t.py", 1, f"Skipped: {reason}"), "call")  # fmt: skip


def test_a_skip_for_an_engine_that_never_started_is_its_own_outcome() -> None:
    assert outcome_of(_skipped(f"{NOT_JUDGED} endpoint http://x could not start")) == "not judged"
    assert outcome_of(_skipped("not supported by llama.cpp (prefix_caching)")) == "not supported"
    assert outcome_of(_skipped("no sliding layer in this checkpoint")) == "skipped"


def _report(**counts: int) -> Report:
    totals = Tally()
    totals.counts.update(counts)
    return Report(impl="--ir-endpoint=http://x/v1", adapter="engine tier:", version="http://x/v1",
                  device="the engine's", dtype="float32", capabilities={}, totals=totals)  # fmt: skip


@pytest.mark.parametrize(("counts", "verdict"), [
    ({"not judged": 17}, NOTHING_JUDGED),
    ({"not judged": 3, "passed": 14}, PARTLY_JUDGED),
    ({"not judged": 3, "failed": 1, "passed": 13}, "wrong"),  # a real failure stays the verdict
    ({"passed": 17, "not supported": 2}, "within the float32 tolerances"),
    ({"not supported": 14}, NOTHING_JUDGED),  # old: "within the float32 tolerances" with nothing run
    ({"xfailed": 2, "skipped": 1}, NOTHING_JUDGED),
])
def test_the_verdict_never_calls_what_was_not_judged_conforming_or_wrong(counts: dict[str, int], verdict: str) -> None:
    assert verdict_of(_report(**counts)) == verdict


def test_the_headline_says_how_many_were_not_judged_and_why() -> None:
    report = _report(**{"not judged": 17})
    report.by_family["llama-tiny"] = report.totals
    report.verdict, report.not_judged = verdict_of(report), "endpoint http://x/v1 could not start (Connection refused)"
    text = report.to_markdown()
    assert "verdict: **nothing judged**; 17 tests not judged: endpoint http://x/v1 could not start (Connection refused)\n" in text
    assert "| checkpoint | passed | failed | xfailed | not supported | not judged | first failure |" in text
    assert "| llama-tiny | 0 | 0 | 0 | 0 | 17 |  |" in text
    # a run where everything was judged keeps the usual columns
    assert "not judged" not in _report(passed=3).to_markdown()


def test_every_reason_a_test_was_not_judged_is_listed_not_only_the_first() -> None:
    report = _report(**{"not judged": 4})
    report.not_judged = "x could not start on /a/gemma (stressed): OSError: no such file"
    report.not_judged_reasons = [report.not_judged, "x could not start on /a/qwen (stressed): OSError: no such file"]
    text = report.to_markdown()
    assert "not judged, every reason:\n- x could not start on /a/gemma (stressed): OSError: no such file\n- x could not start on /a/qwen" in text


@pytest.mark.parametrize(("pytest_status", "ours"), [(0, 0), (1, 1), (2, 130), (3, 70), (4, EXIT_USAGE), (5, EXIT_NOT_JUDGED),
                                                     (EXIT_NOT_JUDGED, EXIT_NOT_JUDGED)])  # fmt: skip
def test_pytest_statuses_map_to_the_commands_documented_ones(pytest_status: int, ours: int) -> None:
    assert conformance_exit_status(pytest_status) == ours


def test_the_matrix_marks_a_case_not_judged_apart_from_not_supported() -> None:
    case = ET.fromstring('<testcase name="test_x[llama-tiny]"><skipped type="pytest.skip" '
                         f'message="{NOT_JUDGED} engine vllm could not start"/></testcase>')  # fmt: skip
    assert junit_outcome(case) == "not judged"
    cell = Cell(("passed", "not judged"))
    assert cell.worst == "not judged" and cell.text == "✓1 ?1"


def _option(values: dict[str, object]) -> SimpleNamespace:
    """A pytest config as the header reads it: its options, and the stash the tier's settings are kept in."""
    return SimpleNamespace(getoption=lambda name: values.get(name), stash={})


def test_the_engine_tier_header_names_the_engine_and_its_tolerances_not_the_adapter_banner() -> None:
    config = _option({"--ir-engine": "llama.cpp", "--ir-engine-dtype": "float32", "--ir-engine-option": ["threads=2"]})
    lines = engine_tier_header(config)  # type: ignore[arg-type]
    assert lines[0] == "infer_ref engine tier: engine llama.cpp, dtype float32"
    assert any(line.startswith("  tolerances: 0.0002 nats from the float64 oracle") for line in lines), lines
    assert "  engine options: threads=2" in lines
    assert not any("cache contract" in line or "hypothesis profile" in line or "dtype: float64" in line for line in lines)


@pytest.mark.parametrize(("long_context", "other"), [(False, "the long-context workload is a run of its own: --long-context"),
                                                   (True, "the default workload is a run without --long-context")])
def test_the_engine_tier_header_names_the_workload_and_how_to_run_the_other(long_context: bool, other: str) -> None:
    config = _option({"--ir-engine": "infer_ref", "--ir-engine-dtype": "float32", "--ir-long-context": long_context})
    [workload] = [line for line in engine_tier_header(config) if line.startswith("  workload: ")]  # type: ignore[arg-type]
    assert other in workload and "deselected" not in workload, workload


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.kit_run
def test_a_closed_endpoint_judges_nothing_and_exits_7(tmp_path: Path) -> None:
    # pytest itself (the command refuses a closed port before pytest starts: test_preflight.py)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "infer_ref.conformance.engines.tests", f"--ir-endpoint={url}",
         f"--ir-model-dir={LLAMA}", f"--ir-report={report}", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_NOT_JUDGED, output[-3000:]
    assert "FAILED" not in output and "Traceback" not in output, output[-3000:]
    import json

    written = json.loads(report.read_text())
    assert written["verdict"] == NOTHING_JUDGED and written["totals"]["counts"]["failed"] == 0
    assert written["totals"]["counts"]["not judged"] > 0 and "Connection refused" in written["not_judged"]


def test_the_command_refuses_a_closed_endpoint_in_one_line_before_pytest(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    proc = subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", "conformance", "--endpoint", url, "--model-dir", str(LLAMA),
         "--report", str(tmp_path / "r.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == EXIT_NOT_JUDGED and proc.stdout == "", proc.stdout[-3000:]
    assert proc.stderr.splitlines() == [f"infer-ref: error: --endpoint {url}: nothing accepts connections at "
                                        f"127.0.0.1:{url.split(':')[2].split('/')[0]} (Connection refused): start the "
                                        "server first, or pass the URL it listens on"]  # fmt: skip
    assert not (tmp_path / "r.json").exists()  # nothing was judged, so no report claims anything


def _collected(*options: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--pyargs",
         "infer_ref.conformance.engines.tests", "--ir-engine=infer_ref", *options],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}, done.stdout


@pytest.mark.kit_run  # two child processes collecting the tier
def test_each_workload_collects_only_its_own_tests_and_nothing_reads_deselected() -> None:
    # old: "collected 205 items / 64 deselected / 141 selected" in every run's header
    default, out = _collected()
    long, long_out = _collected("--ir-long-context")
    assert "deselected" not in out and "deselected" not in long_out, (out[-500:], long_out[-500:])
    assert default and long and not default & long
    assert all("test_long_context.py" not in node for node in default)
    assert any("test_recipe_statistics_at_long_distances" in node for node in long)  # a long test outside that module
