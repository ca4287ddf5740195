"""The tuning tables keyed by (device, shape) pick, on an H100, exactly what the shape-keyed tables
before them picked.

The decode speed is tuned to the last percent on an H100 (sm_90, 132 SMs), so moving the tables
must not move a single launch there. The old selection is restated here as data and arithmetic
(the tables' entries, ``4 * 132`` target programs, the heuristic's rule, the attention tiling by
head dim): nothing of it is imported from the package under test. The new selection is asked of a
CUDA device reporting capability 9.0 and 132 SMs (the device query faked: no GPU needed), for every
decode projection and head dim of the three fixture checkpoints and of Llama-3.2-1B, Qwen3-1.7B and
Gemma-3-1b, every row count the kernels take, and the split counts of batches 1..64 over contexts
of 128..16384 positions.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS
from infer_ref.fast.kernels import common
from infer_ref.fast.kernels.attention import decode_num_splits, default_tile
from infer_ref.fast.kernels.attention.tuning import combine_chunk
from infer_ref.fast.kernels.gemv import CUBLAS_SHAPES, MAX_ROWS, GemvConfig, gemv_config

ROOT = Path(__file__).resolve().parents[2]


class Shape(NamedTuple):
    """What a decoder's decode step multiplies and attends by."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


# The shapes, stated (each checked against its source below).
FIXTURES = {  # fixtures/checkpoints/<name>/config.json
    "llama-tiny": Shape(128, 4, 2, 32, 384, 439),
    "qwen3-tiny": Shape(64, 4, 2, 32, 192, 448),
    "gemma3-tiny": Shape(64, 4, 1, 32, 256, 397),
}
REAL = {  # infer_ref.conformance.checkpoints.snapshots.REAL_SHAPE_CONFIGS (the published configs' shapes)
    "llama-3.2-1b": Shape(2048, 32, 8, 64, 8192, 128256),
    "qwen3-1.7b": Shape(2048, 16, 8, 128, 6144, 151936),
    "gemma-3-1b-it": Shape(1152, 4, 1, 256, 6912, 262144),
}
MODELS = {**FIXTURES, **REAL}


def _shape_of(config: ModelConfig) -> Shape:
    return Shape(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.computed_head_dim,
        config.intermediate_size, config.vocab_size,
    )  # fmt: skip


def _projections(s: Shape) -> dict[str, tuple[int, int, bool]]:
    """``(N, K, gated)`` of each product of a decode step (qkv and gate_up stacked, gate_up gated)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {
        "qkv": (q + 2 * kv, s.hidden, False),
        "o": (s.hidden, q, False),
        "gate_up": (2 * s.intermediate, s.hidden, True),
        "down": (s.hidden, s.intermediate, False),
        "lm_head": (s.vocab, s.hidden, False),
    }


# -- the old selection, as data and arithmetic ---------------------------------------------------------

# (block_n, block_k, split_k, num_warps, num_stages, path, prefetch_tiles, weight_first) by (N, K).
OLD_LINEAR = {
    (3072, 2048): (4, 1024, 1, 4, 3, "fma", 2, False),
    (2048, 2048): (4, 1024, 1, 4, 3, "fma", 2, False),
    (2048, 8192): (4, 1024, 1, 4, 3, "fma", 1, True),
    (128256, 2048): (4, 1024, 1, 4, 3, "fma", 1, True),
    (4096, 2048): (4, 1024, 1, 4, 3, "fma", 1, False),
    (2048, 6144): (4, 1024, 1, 4, 3, "fma", 1, False),
    (151936, 2048): (4, 1024, 1, 4, 3, "fma", 1, False),
    (1536, 1152): (8, 512, 1, 4, 3, "fma", 1, True),
    (1152, 1024): (4, 1024, 1, 4, 3, "fma", 1, False),
    (1152, 6912): (4, 1024, 4, 4, 3, "fma", 1, True),
    (262144, 1152): (8, 256, 1, 4, 2, "fma", 1, True),
}
OLD_GATED = {
    (16384, 2048): (32, 256, 1, 4, 3, "dot", 1, True),
    (12288, 2048): (8, 256, 1, 4, 2, "fma", 1, False),
    (13824, 1152): (16, 256, 1, 4, 2, "fma", 1, True),
}
OLD_TABLE_ROWS = 1
OLD_TARGET_PROGRAMS = 4 * 132
OLD_CUBLAS_SHAPES = {(3072, 2048), (4096, 2048)}
# (block_n, first_n, num_warps, heads_per_program) by head dim padded to a power of two in [64, 256].
OLD_TILES = {64: (16, 64, 4, None), 128: (16, 32, 2, None), 256: (16, 16, 4, 1)}


def _old_gemv(n: int, k: int, rows: int, gated: bool) -> tuple[object, ...]:
    """The old gemv_config: the table (up to one row), else the heuristic with 528 target programs."""
    found = (OLD_GATED if gated else OLD_LINEAR).get((n, k))
    if found is not None and rows <= OLD_TABLE_ROWS:
        return found
    n_out = n // 2 if gated else n
    block_n = 64 if math.ceil(n_out / 64) >= OLD_TARGET_PROGRAMS else 32
    split_k = max(1, min(math.ceil(OLD_TARGET_PROGRAMS / math.ceil(n_out / block_n)), k // 256))
    return (block_n, 128, split_k, 4, 4, "dot", 1, False)


def _fields(c: GemvConfig) -> tuple[object, ...]:
    return (c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages, c.path, c.prefetch_tiles, c.weight_first)


def _old_tile(head_dim: int) -> tuple[int, int, int, int | None]:
    pad = 1 << (head_dim - 1).bit_length()
    return OLD_TILES[min(max(pad, 64), 256)]


def _old_splits(batch: int, head_blocks: int, max_visible: int, first_n: int) -> int:
    """The old split count on 132 SMs: four waves, no split shorter than a first tile, at most 128."""
    wanted = -(-4 * 132 // (batch * head_blocks))
    return max(1, min(wanted, max(1, -(-max_visible // first_n)), 128))


# -- the new selection, asked of a faked H100 ------------------------------------------------------------


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch) -> common.DeviceProfile:
    """The profile of CUDA device 0 when it reports what an H100 reports (capability 9.0, 132 SMs)."""
    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    common._cuda_profile.cache_clear()
    profile = common.device_profile(torch.device("cuda", 0))
    common._cuda_profile.cache_clear()  # no faked profile outlives the test
    assert profile == common.DeviceProfile(capability=(9, 0), sm_count=132)
    return profile


@pytest.mark.parametrize("name", list(FIXTURES))
def test_the_stated_fixture_shapes_are_the_checkpoints(name: str) -> None:
    config = json.loads((ROOT / "fixtures" / "checkpoints" / name / "config.json").read_text())
    assert _shape_of(ModelConfig.from_hf_dict(config)) == FIXTURES[name]


@pytest.mark.parametrize("name", list(REAL))
def test_the_stated_real_shapes_are_the_published_ones(name: str) -> None:
    assert _shape_of(ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS[name])) == REAL[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_gemv_tables_pick_what_they_picked_on_an_h100(name: str, h100: common.DeviceProfile) -> None:
    for proj, (n, k, gated) in _projections(MODELS[name]).items():
        for rows in range(1, MAX_ROWS + 1):
            got = _fields(gemv_config(n, k, rows, gated=gated, device=h100))
            assert got == _old_gemv(n, k, rows, gated), f"{name}/{proj} [{n}, {k}] rows {rows}"
        if not gated:  # the dispatch's cuBLAS rule for plain products
            assert ((n, k) in CUBLAS_SHAPES) == ((n, k) in OLD_CUBLAS_SHAPES), f"{name}/{proj}"


def test_every_old_table_entry_is_still_an_h100_entry(h100: common.DeviceProfile) -> None:
    """Each shape the old tables held (the real shapes above reach all of them; this says so)."""
    reached = {(n, k, g) for s in REAL.values() for n, k, g in _projections(s).values()}
    old = {(n, k, False) for n, k in OLD_LINEAR} | {(n, k, True) for n, k in OLD_GATED}
    assert old <= reached
    for n, k, gated in old:
        assert _fields(gemv_config(n, k, 1, gated=gated, device=h100)) == (OLD_GATED if gated else OLD_LINEAR)[n, k]


@pytest.mark.parametrize("name", list(MODELS))
def test_attention_tiles_and_splits_are_what_they_were_on_an_h100(name: str, h100: common.DeviceProfile) -> None:
    s = MODELS[name]
    tile = default_tile(s.head_dim, h100)
    block_n, first_n, num_warps, heads = _old_tile(s.head_dim)
    assert (tile.block_n, tile.first_n, tile.num_warps, tile.heads_per_program) == (block_n, first_n, num_warps, heads)
    group = s.heads // s.kv_heads
    head_blocks = s.kv_heads * group // (heads or group)
    first = max(first_n, block_n)  # the launch's first tile (no knobs)
    for batch in (1, 2, 4, 8, 16, 64):
        for visible in (128, 1024, 4096, 16384):
            got = decode_num_splits(batch, head_blocks, visible, first, h100.sm_count)
            assert got == _old_splits(batch, head_blocks, visible, first), f"{name} batch {batch} {visible} keys"
            # The combine's chunk: about 4096 partial values of [chunk, heads (a power of two), head dim].
            per_split = (1 << ((heads or group) - 1).bit_length()) * (1 << (max(s.head_dim, 16) - 1).bit_length())
            want_chunk = max(1, min(1 << (got - 1).bit_length(), 4096 // per_split))
            assert combine_chunk(heads or group, 1 << (max(s.head_dim, 16) - 1).bit_length(), got) == want_chunk


def test_a_device_without_entries_takes_the_heuristic_for_its_own_sms() -> None:
    """An sm_80 device with 108 SMs: no table entry applies, and the heuristic fills 432 programs."""
    a100 = common.DeviceProfile(capability=(8, 0), sm_count=108)
    got = gemv_config(3072, 2048, 1, device=a100)  # Llama's qkv: 96 blocks of 32, ceil(432 / 96) = 5 splits
    assert (got.path, got.block_n, got.split_k) == ("dot", 32, 5)
    assert decode_num_splits(1, 8, 16384, 64, a100.sm_count) == 54  # ceil(4 * 108 / 8)
