"""Paged decode attention, for any implementation that exposes one.

The oracle is float64 attention written out (``oracle.naive_attention``) over the contiguous K/V of
each sequence. The paged side scatters those K/V into physical blocks in a random order, fills
every other block with NaN (stale, unwritten or freed blocks) and pads the tables past each
sequence's blocks with the ids of NaN blocks: a reader that touches anything beyond a sequence's
``ceil(len / block_size)`` blocks, or beyond ``len`` inside its last block, returns NaN.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance.assertions import assert_close
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys

pytestmark = pytest.mark.ir_requires("paged_attention")


@st.composite
def paged_cases(draw: st.DrawFn) -> dict[str, Any]:
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    batch = draw(st.integers(1, 3))
    lengths = []
    for _ in range(batch):
        k = draw(st.integers(1, 4))
        lengths.append(draw(st.sampled_from([max(1, k * block_size - 1), k * block_size, k * block_size + 1, draw(st.integers(1, 40))])))
    hkv = draw(st.sampled_from([1, 2]))
    return {
        "block_size": block_size,
        "lengths": lengths,
        "hkv": hkv,
        "groups": draw(st.sampled_from([1, 2, 4])),
        "d": draw(st.sampled_from([4, 8, 16])),
        "window": draw(st.one_of(st.none(), st.integers(1, 12))),
        "seed": draw(st.integers(0, 2**16)),
        "spare": draw(st.integers(0, 3)),
    }


def _build(case: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous K/V per sequence, and the paged pools, tables and lengths holding them."""
    bs, hkv, d = case["block_size"], case["hkv"], case["d"]
    g = torch.Generator().manual_seed(case["seed"])
    ks = [torch.randn(hkv, n, d, generator=g, dtype=torch.float64) for n in case["lengths"]]
    vs = [torch.randn(hkv, n, d, generator=g, dtype=torch.float64) for n in case["lengths"]]
    needed = [math.ceil(n / bs) for n in case["lengths"]]
    num_blocks = sum(needed) + case["spare"] + 1  # at least one NaN block for table padding
    order = torch.randperm(num_blocks, generator=g).tolist()
    k_pool = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=torch.float64)
    v_pool = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=torch.float64)
    width = max(needed) + 1
    nan_block = order[-1]  # never holds a written position
    tables = []
    for k, v, m in zip(ks, vs, needed, strict=True):
        blocks, order = order[:m], order[m:]
        for pos in range(k.shape[1]):
            k_pool[blocks[pos // bs], pos % bs] = k[:, pos]
            v_pool[blocks[pos // bs], pos % bs] = v[:, pos]
        tables.append(blocks + [nan_block] * (width - m))  # stale entries past the sequence
    q = torch.randn(len(ks), hkv * case["groups"], d, generator=g, dtype=torch.float64)
    table = torch.tensor(tables, dtype=torch.int32)
    lengths = torch.tensor(case["lengths"], dtype=torch.int32)
    return ks, vs, q, k_pool, v_pool, table, lengths  # type: ignore[return-value]


@given(case=paged_cases())
def test_paged_decode_equals_attention_over_the_contiguous_prefix(ir_adapter: Adapter, case: dict[str, Any]) -> None:
    """Permuted physical blocks, NaN in every block and slot a sequence does not own, stale table
    entries: the output equals float64 attention over each sequence's own keys, window applied.

    Guards: *paged read past the sequence's last written slot* (past ``ceil(len/bs)`` blocks or past
    ``len`` in the last block), the window not applied (or off by one) on decode, GQA heads mapped to
    the wrong KV head. The test places every key itself: where a cache writes a decode token is
    judged by ``test_cache.py``, not here.
    """
    assert ir_adapter.paged_decode_attention is not None
    ks, vs, q, k_pool, v_pool, table, lengths = _build(case)  # type: ignore[misc]
    scale = case["d"] ** -0.5
    out = ir_adapter.paged_decode_attention(q, k_pool, v_pool, table, lengths, scale, case["window"])
    for row, (k, v) in enumerate(zip(ks, vs, strict=True)):
        n = k.shape[1]
        visible = visible_keys(1, n - 1, case["window"])  # the query sits at position n - 1
        want = naive_attention(q[row][None, :, None], k[None], v[None], visible, scale)[0, :, 0]  # [H, D]
        assert_close(out[row], want, what=f"paged decode output of row {row} (length {n})", atol=1e-10, rtol=1e-10, params=case)


def test_relabelling_blocks_changes_nothing(ir_adapter: Adapter) -> None:
    """The same contents under two different physical labellings give bitwise equal outputs."""
    assert ir_adapter.paged_decode_attention is not None
    case = {"block_size": 3, "lengths": [7, 2, 9], "hkv": 2, "groups": 2, "d": 8, "window": None, "seed": 1, "spare": 2}
    _, _, q, k_pool, v_pool, table, lengths = _build(case)  # type: ignore[misc]
    out = ir_adapter.paged_decode_attention(q, k_pool, v_pool, table, lengths, 0.3, None)
    relabel = torch.randperm(k_pool.shape[0], generator=torch.Generator().manual_seed(7))  # old id -> new id
    k2, v2 = torch.empty_like(k_pool), torch.empty_like(v_pool)
    k2[relabel], v2[relabel] = k_pool, v_pool
    out2 = ir_adapter.paged_decode_attention(q, k2, v2, relabel[table.long()].int(), lengths, 0.3, None)
    assert torch.equal(out, out2), "relabelling physical blocks changed the output"
