"""decode_compare.py on a real shape in bf16 on a GPU (marked ``gpu``): every path and point is reported.

Run: ``PYTHONPATH=. pytest -m gpu tests/benchmarks/test_decode_compare_gpu.py`` (about a minute on an
H100; no compile). Whether each path *counts* is the benchmark's finding, printed and stored, not
asserted here; what is asserted is that every number is there and finite, and that the float32
reference really differs from the bf16 paths (a reference that was the bf16 model itself would
score the eager loop at exactly 0).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import decode_compare

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a real-shape bf16 model)"),
]

CONTEXTS = (128, 1024)
NEW_TOKENS = 16


def _agreement_ok(a: dict[str, Any] | None) -> bool:
    return (a is not None and a["steps"] == NEW_TOKENS - 1
            and all(math.isfinite(a[k]) and a[k] >= 0 for k in ("mean_kl", "max_abs_dlogprob")))


def test_real_shape_sweep_reports_every_path_and_point(tmp_path: Path) -> None:
    result = decode_compare.main([
        "--device", "cuda", "--models", "llama-3.2-1b", "--contexts", *map(str, CONTEXTS),
        "--caches", "static", "paged", "--new-tokens", str(NEW_TOKENS), "--rounds", "1", "--warmup", "0",
        "--repeats", "1", "--json", str(tmp_path / "compare.json"), "--plot", str(tmp_path / "sweep.png"),
    ])
    assert "errors" not in result and result["skipped"] == []
    (row,) = result["rows"]
    assert row["errors"] == []
    assert set(row["paths"]) == {"ir_loop", "ir_fast", "hf_loop"}
    for name, path in row["paths"].items():
        assert path["tokens_per_s"] > 0 and _agreement_ok(path), (name, path)
        assert path["counts"] is not None, name
    assert row["paths"]["ir_loop"]["mean_kl"] > 0  # bf16 against a float32 reference is never exact
    assert [(p["cache"], p["context"]) for p in row["sweep"]] == [(c, n) for c in ("static", "paged") for n in CONTEXTS]
    for p in row["sweep"]:
        assert p["step"] == "graph" and p["tokens_per_s"] > 0 and math.isfinite(p["pct_copy_bw"]), p
        assert _agreement_ok(p["accuracy"]) and _agreement_ok(p["hf_accuracy"]) and p["counts"] is not None, p
        assert p["cache"] == "static" or p["vs_static"] > 0, p
    assert (tmp_path / "sweep.png").stat().st_size > 0
