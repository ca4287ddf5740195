"""Pieces of the context sweep: KV bytes attended, paged-vs-static ratios, verdicts, the cache options passed on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from benchmarks import context_sweep, decode_compare
from benchmarks.bench_utils import kv_bytes_attended
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import TINY_CONFIGS
from infer_ref.engine import FastDecoder


def test_kv_bytes_attended_counts_each_layers_keys_a_sliding_layer_at_most_its_window() -> None:
    config = ModelConfig.from_hf_dict(TINY_CONFIGS["gemma3_text"])
    window = config.sliding_window
    assert window == 6 and "sliding_attention" in config.layer_types and "full_attention" in config.layer_types
    sliding = config.layer_types.count("sliding_attention")
    full = config.num_hidden_layers - sliding
    per_key = 2 * config.num_key_value_heads * config.computed_head_dim * 4  # K and V, float32
    # prompt 4, 3 steps: positions 4, 5, 6 attend 5, 6, 7 keys; a sliding layer 5, 6, 6
    expected = per_key * (full * (5 + 6 + 7) + sliding * (5 + 6 + 6)) / 3
    assert kv_bytes_attended(config, 4, 3, 4) == pytest.approx(expected)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        kv_bytes_attended(config, 4, 0, 4)


def test_paged_points_get_their_ratio_to_the_static_point_at_the_same_context() -> None:
    points = [
        {"cache": "static", "context": 128, "tokens_per_s": 400.0},
        {"cache": "paged", "context": 128, "tokens_per_s": 500.0},
        {"cache": "static", "context": 1024, "skipped": "budget"},
        {"cache": "paged", "context": 1024, "tokens_per_s": 300.0},
    ]
    context_sweep.add_vs_static(points)
    assert points[1]["vs_static"] == 1.25
    assert "vs_static" not in points[0] and "vs_static" not in points[3]  # no static number to divide by


def test_a_point_counts_only_against_a_baseline() -> None:
    baseline = {"steps": 3, "mean_kl": 1e-3, "max_abs_dlogprob": 0.1}
    assert context_sweep.judge({"steps": 3, "mean_kl": 1.2e-3, "max_abs_dlogprob": 0.1}, baseline, 1.25) is True
    assert context_sweep.judge({"steps": 3, "mean_kl": 2e-3, "max_abs_dlogprob": 0.1}, baseline, 1.25) is False
    assert context_sweep.judge(baseline, None, 1.25) is None


def test_an_unknown_cache_type_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"cache must be one of static, paged, got 'ring'"):
        context_sweep.build_fast_decoder(torch.nn.Linear(1, 1), 64, "ring", block_size=16,
                                         device=torch.device("cpu"), compile=False)


class RecordingDecoder(FastDecoder):
    """A FastDecoder that records the cache options it was built with."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, model: Any, max_seq_len: int, *, cache: str = "static", block_size: int = 16, **kw: Any) -> None:
        RecordingDecoder.seen.append({"cache": cache, "block_size": block_size, "max_seq_len": max_seq_len})
        super().__init__(model, max_seq_len, cache=cache, block_size=block_size, **kw)


def test_paged_rows_are_built_with_the_cache_options_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context_sweep, "FastDecoder", RecordingDecoder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        decode_compare.main([
            "--device", "cpu", "--models", "tiny-llama", "--contexts", "12", "20", "--caches", "static", "paged",
            "--block-size", "8", "--new-tokens", "4", "--fast-only", "--warmup", "0", "--repeats", "1",
            "--json", str(tmp_path / "c.json"),
        ])
    finally:
        torch.set_num_threads(threads)
    assert {"cache": "paged", "block_size": 8, "max_seq_len": 24} in RecordingDecoder.seen
    row = json.loads((tmp_path / "c.json").read_text())["rows"][0]
    paged = [p for p in row["sweep"] if p["cache"] == "paged"]
    assert [p["context"] for p in paged] == [12, 20] and row["errors"] == []
    for p in paged:
        assert p["vs_static"] > 0 and p["accuracy"]["mean_kl"] <= 1e-10
        assert p["counts"] is None  # --fast-only: no transformers baseline
