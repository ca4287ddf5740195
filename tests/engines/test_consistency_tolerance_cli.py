"""A self-consistency tolerance refused from the command line: one line, no traceback."""

from __future__ import annotations

import subprocess
import sys


def test_a_tolerance_looser_than_the_oracle_is_one_line_from_the_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = subprocess.run([sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", "infer_ref", "--consistency-tolerance", "0.5"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "--ir-consistency-tolerance must be in (0, 0.0002] for float32" in out and "Traceback" not in out, out[-2000:]
