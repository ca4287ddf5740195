"""The worked example of docs/conformance.md, run as an implementer would run it.

``examples/naive_cache_adapter.py`` is an independent cache (a list of tensors per layer) with its
own mask and attention; a subprocess runs the cache, mask, attention and model properties against
it with ``--ir-impl`` and an xfail file, and this test checks the outcome and the plugin's report:
header, skips of capabilities it lacks, the xfail entry applied, the stale entry reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_suite_runs_against_the_example_adapter(tmp_path: Path) -> None:
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        "# an entry that matches (the test passes, so it reports XPASS)\n"
        "test_masks.py::test_boundary_cases[1-0-None]\n"
        "test_cache.py::test_this_test_does_not_exist  # stale\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_HYPOTHESIS_PROFILE": "dev"}
    cmd = [
        sys.executable, "-m", "pytest",
        *(f"infer_ref/testing/conformance/{name}" for name in ("test_cache.py", "test_masks.py", "test_attention.py", "test_model.py", "test_rope.py")),
        "--ir-impl=examples.naive_cache_adapter:ADAPTER", f"--ir-xfails={xfails}",
        "-p", "no:cacheprovider", "-p", "no:xdist", "-rsX", "-W", "default",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "implementation examples.naive_cache_adapter:ADAPTER = naive-append-cache 1.0" in out, out[:2000]
    assert "hypothesis profile: dev" in out
    assert "not supported by naive-append-cache (rope: adapter has no rope_tables, apply_rope)" in out
    assert "not supported by naive-append-cache (cache.memory_bytes: its cache has no memory_bytes)" in out
    assert "1 xpassed" in out, out[-2000:]
    assert "stale entries" in out and "test_this_test_does_not_exist" in out, out[-3000:]
