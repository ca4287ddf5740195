"""A planted bug on one checkpoint, through ``infer-ref conformance`` as a user runs it (outside the
checkout): the failures print in under 40 lines with the likely bug class and one repro command
that runs from a wheel install; pytest's tracebacks only with ``--tracebacks``; every command the
report prints names the kit's tests by package, never by a path of a checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.paths import FIXTURE_CHECKPOINTS

pytestmark = pytest.mark.kit_run

PLANTED = "infer_ref.conformance.engines.mutants:preemption_stale_position"
MOST_LINES = 40


def _conformance(tmp_path: Path, *extra: str) -> tuple[str, str]:
    """The run's terminal output and its Markdown report."""
    report = tmp_path / "report.md"
    cmd = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", PLANTED,
           "--model-dir", str(FIXTURE_CHECKPOINTS / "llama-tiny"), "--report", str(report), *extra]  # fmt: skip
    env = {**os.environ, "INFER_REF_REPRO_DIR": str(tmp_path / "repros")}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr, report.read_text()


def _commands(text: str) -> list[str]:
    """Every pytest command in ``text`` (from ``pytest`` to the end of its line or backquote)."""
    return re.findall(r"(?<![\w/])pytest [^`\n]*", text)


def test_a_failure_on_one_checkpoint_prints_under_40_lines_with_one_repro(tmp_path: Path) -> None:
    output, report = _conformance(tmp_path)
    lines = output.splitlines()
    assert len(lines) < MOST_LINES, output
    assert "most likely bug class: preemption resumes from a stale position (" in output, output
    repro = [line for line in lines if line.startswith("repro: ")]
    assert len(repro) == 1 and repro[0].startswith(
        "repro: pytest --pyargs infer_ref.conformance.engines.tests."
    ), repro
    assert "Traceback" not in output and "judge.py" not in output, (
        output
    )  # no kit source without --tracebacks
    for command in _commands(output) + _commands(report):
        assert (
            "--pyargs" in command and ".py::" not in command and "conformance/engines/tests" not in command
        ), command


def test_tracebacks_only_with_the_flag(tmp_path: Path) -> None:
    output, _ = _conformance(tmp_path, "--tracebacks")
    assert "verdicts/judge.py" in output and "AssertionError" in output, output[-3000:]
