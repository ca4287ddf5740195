"""How often the engine tier's blame names the planted class: every planted engine bug
(:mod:`~infer_ref.conformance.engines.mutants`) judged by the default workload on its checkpoint,
through ``infer-ref conformance`` as a user runs it, and the class its report names.

    python -m infer_ref.conformance.engines.blame_hits [--only NAME ...]

prints one row per planted bug (the bug, its class, the class named, hit or miss, and for a miss
the report's reason) and the hit rate; exit status 0 when every bug was caught. The slow tier's
``tests/engines/test_planted_engine_bugs.py`` asserts the same rows from the same runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ref.conformance.engines.mutants import ENGINE_MUTANTS, PlantedBug
from infer_ref.paths import FIXTURE_CHECKPOINTS


@dataclass(frozen=True)
class PlantedRun:
    """One planted bug judged: the command's exit status, its report (JSON) and its terminal output."""

    bug: PlantedBug
    returncode: int
    report: dict[str, Any]
    output: str
    failed: list[str]  # the failed test cases, ``test_x[checkpoint]``

    @property
    def named(self) -> str:
        return str(self.report.get("most_likely", ""))

    @property
    def hit(self) -> bool:
        return self.named == self.bug.bug_class

    @property
    def tied(self) -> bool:
        """The planted class is as likely as the one named: the tier's tests do not separate them."""
        return self.report.get("blame", {}).get(self.bug.bug_class, {}).get("verdict") == "as likely"


def run_planted(bug: PlantedBug, workdir: Path, *extra: str) -> PlantedRun:
    """``infer-ref conformance --engine infer_ref.conformance.engines.mutants:NAME`` on the bug's
    checkpoint, the default workload, from ``workdir``."""
    report, junit = workdir / f"{bug.name}.json", workdir / f"{bug.name}.xml"
    command = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine",
               f"infer_ref.conformance.engines.mutants:{bug.name}", "--model-dir", str(FIXTURE_CHECKPOINTS / bug.checkpoint),
               "--report", str(report), *extra, "--", f"--junitxml={junit}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=workdir, timeout=900)
    data = json.loads(report.read_text()) if report.is_file() else {}
    return PlantedRun(bug, done.returncode, data, done.stdout + done.stderr, failed_tests(junit))


def failed_tests(junit: Path) -> list[str]:
    """``test_x[checkpoint]`` of every failed test case in a JUnit XML report."""
    if not junit.is_file():
        return []
    cases = ET.parse(junit).getroot().iter("testcase")
    return [str(c.get("name")) for c in cases if c.find("failure") is not None or c.find("error") is not None]


def row(run: PlantedRun) -> str:
    """``| bug | planted class | named | hit/miss (why) |``."""
    if run.hit:
        verdict = "hit"
    elif run.tied:
        verdict = "miss: as likely as the class named (the tier's tests do not separate them)"
    else:
        verdict = (
            f"miss: {run.report.get('blame', {}).get(run.bug.bug_class, {}).get('why', 'not a candidate')}"
        )
    return f"| {run.bug.name} | {run.bug.bug_class} | {run.named or '(none)'} | {verdict} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these planted bugs only")
    args = parser.parse_args(argv)
    bugs = [b for b in ENGINE_MUTANTS if not args.only or b.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_planted(bug, Path(tmp)) for bug in bugs]
    print("| planted bug | its class | class named | hit |\n|---|---|---|---|")
    for run in runs:
        print(row(run))
    hits = sum(run.hit for run in runs)
    print(f"\nnamed the planted class: {hits} of {len(runs)}")
    return 0 if all(run.returncode == 1 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
