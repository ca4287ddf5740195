"""Run ``infer-ref conformance`` in a subprocess, as a user would, and read its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def plugin_args() -> list[str]:
    """What a plain ``python -m pytest`` needs to load the kit's plugin: nothing where it is installed
    (its entry point loads it; naming it again would register it twice), ``-p`` from a source tree."""
    installed = any(ep.name == "infer_ref" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "infer_ref.conformance.plugin"]


@dataclass
class Run:
    returncode: int
    output: str
    report: dict[str, Any]


def conformance(
    impl: str, *args: str, cwd: Path, profile: str = "dev", env: dict[str, str] | None = None, timeout: int = 600
) -> Run:
    """``infer-ref conformance --impl IMPL --profile PROFILE ARGS`` from ``cwd`` (the kit on PYTHONPATH).

    ``dev`` for runs that must pass; ``mutants`` (derandomized, no shrinking: the same verdict
    every time, sooner) for runs that must catch a bug."""
    report = cwd / "conformance-report.json"
    report.unlink(missing_ok=True)
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]), **(env or {})}
    cmd = [sys.executable, "-m", "infer_ref.cli", "conformance", "--impl", impl, "--profile", profile, "--report", str(report), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    return Run(proc.returncode, out, json.loads(report.read_text()) if report.is_file() else {})
