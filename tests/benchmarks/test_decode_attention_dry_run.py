"""CPU dry run of benchmarks/bench_decode_attention.py: the harness end to end on tiny contexts.

On a CPU the dispatching entry points take their torch references, so the fused step (the
reference of the fused kernel) and the unfused chain (norms, RoPE, store, paged attention, each by
its own definition) compute the same thing: they must agree, and every row must carry finite,
positive timings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import bench_decode_attention


def test_dry_run_reports_every_family_and_context(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "decode_attention.json"
    report = bench_decode_attention.main(["--dry-run", "--contexts", "16", "33", "--layers", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["dry_run"] is True and report["pdl"] is False
    rows = report["rows"]
    assert [(r["family"], r["context"]) for r in rows] == [(f, c) for f in bench_decode_attention.FAMILIES for c in (16, 33)]
    for r in rows:
        assert r["agree"], r
        assert r["max_abs_diff"] < 2e-2, r
        for key in ("fused_us", "unfused_us", "speedup", "fused_GBps"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert (r["heads"], r["kv_heads"], r["head_dim"]) == bench_decode_attention.FAMILIES[r["family"]][:3]
    printed = capsys.readouterr().out
    assert "fused us" in printed and "unfused us" in printed and "DISAGREE" not in printed
