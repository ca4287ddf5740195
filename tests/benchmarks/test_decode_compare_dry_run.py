"""CPU dry run of benchmarks/decode_compare.py on the tiny synthetic models (float32, torch on one thread).

In float32 every path computes what the float32 reference computes, up to reduction order, so each
path's agreement must lie within the reference's own resolution (``REFERENCE_RESOLUTION``: mean KL
<= 1e-10, max |Δlogprob| <= 1e-5; the argument is in benchmarks/accuracy.py), and so every path
counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import decode_compare
from benchmarks.accuracy import REFERENCE_RESOLUTION

CONTEXTS = (16, 40)
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("compare")
    decode_compare.main([
        "--device", "cpu", "--tiny", "--contexts", *map(str, CONTEXTS), "--caches", "static", "paged",
        "--new-tokens", str(NEW_TOKENS), "--rounds", "1", "--warmup", "0", "--repeats", "1",
        "--json", str(out / "compare.json"), "--markdown", str(out / "compare.md"),
    ])
    return {"json": json.loads((out / "compare.json").read_text()), "markdown": (out / "compare.md").read_text()}


def _finite(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _within_resolution(accuracy: dict[str, Any]) -> bool:
    return (accuracy["steps"] == NEW_TOKENS - 1
            and 0.0 <= accuracy["mean_kl"] <= REFERENCE_RESOLUTION.mean_kl
            and 0.0 <= accuracy["max_abs_dlogprob"] <= REFERENCE_RESOLUTION.max_abs_dlogprob)


def test_every_tiny_model_has_a_row(report: dict[str, Any]) -> None:
    data = report["json"]
    assert "errors" not in data, data.get("errors")
    assert [r["model"] for r in data["rows"]] == list(decode_compare.TINY)
    assert all(r["errors"] == [] for r in data["rows"]), [r["errors"] for r in data["rows"]]
    assert data["contexts"] == list(CONTEXTS) and data["accuracy_margin"] == 1.25 and data["skipped"] == []


def test_each_timed_path_reports_tokens_per_s_and_agreement_within_float32_resolution(report: dict[str, Any]) -> None:
    for row in report["json"]["rows"]:
        assert set(row["paths"]) == {"ir_loop", "ir_fast", "hf_loop"}, row["model"]  # no compile on a CPU
        for name, path in row["paths"].items():
            assert _finite(path["tokens_per_s"]) and path["tokens_per_s"] > 0, (row["model"], name)
            assert _within_resolution(path), (row["model"], name, path)
            assert path["counts"] is True, (row["model"], name, path)


@pytest.mark.parametrize("cache", ["static", "paged"])
def test_the_sweep_has_every_context_for_each_cache(report: dict[str, Any], cache: str) -> None:
    for row in report["json"]["rows"]:
        points = [p for p in row["sweep"] if p["cache"] == cache]
        assert [p["context"] for p in points] == list(CONTEXTS)
        for p in points:
            assert p["step"] == "uncaptured" and p["max_seq_len"] >= max(CONTEXTS) + NEW_TOKENS
            assert _finite(p["tokens_per_s"], p["bandwidth_GBps"], p["pct_copy_bw"], p["kv_bytes_per_token_mean"])
            assert _within_resolution(p["accuracy"]) and _within_resolution(p["hf_accuracy"])
            assert p["counts"] is True


def test_paged_points_carry_their_ratio_to_static(report: dict[str, Any]) -> None:
    for row in report["json"]["rows"]:
        static = {p["context"]: p["tokens_per_s"] for p in row["sweep"] if p["cache"] == "static"}
        for p in (p for p in row["sweep"] if p["cache"] == "paged"):
            assert p["vs_static"] == pytest.approx(p["tokens_per_s"] / static[p["context"]])


def test_the_markdown_has_the_accuracy_and_sweep_tables(report: dict[str, Any]) -> None:
    md = report["markdown"]
    assert "| model | path | tok/s | mean KL(ref ‖ path) | max abs Δlogprob of the reference token | counts |" in md
    assert md.count("| tiny-llama | static | uncaptured |") == len(CONTEXTS)


def test_a_budget_too_small_for_anything_skips_and_lists_every_unit(tmp_path: Path, one_thread: None) -> None:
    result = decode_compare.main([
        "--device", "cpu", "--models", "tiny-llama", "--contexts", "16", "--new-tokens", "4",
        "--budget-s", "0.001", "--json", str(tmp_path / "c.json"),
    ])
    skipped = [s["what"] for s in result["skipped"]]
    assert "tiny-llama: float32 copy of the weights" in skipped
    assert "tiny-llama: eager/transformers rounds" in skipped
    assert "tiny-llama: static decoder" in skipped
    row = result["rows"][0]
    assert row["sweep"] == [{"cache": "static", "context": 16, "skipped": "decoder: budget"}]
    assert row["paths"] == {} and row["errors"] == []
