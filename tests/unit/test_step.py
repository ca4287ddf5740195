"""The step a cache plans for a forward: positions, masks, lengths and tables, once for every layer."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.pool import BlockPool
from infer_ref.cache.protocol import plan_step
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.masks import attention_mask

CPU = torch.device("cpu")
WINDOWS = [None, 3, None]  # three layers, the middle one sliding


def _dense(mask: torch.Tensor | None, t: int, keys: int) -> torch.Tensor:
    return torch.ones(t, keys, dtype=torch.bool) if mask is None else mask


@pytest.mark.parametrize(("start", "t"), [(0, 4), (5, 1), (6, 3)])
def test_a_contiguous_cache_plans_the_causal_step_after_its_length(start: int, t: int) -> None:
    cache = KVCache.allocate(3, 1, 2, 16, dtype=torch.float32, device="cpu")
    if start:
        zeros = torch.zeros(1, 1, start, 2)  # [B, Hkv, start, D]: every layer writes before the advance
        for layer in range(cache.num_layers):
            cache.update(layer, zeros, zeros)
        cache.advance(start)
    step = plan_step(cache, t, WINDOWS, CPU)
    assert torch.equal(step.positions, torch.arange(start, start + t))
    assert not step.static_shape and step.lengths is None and step.block_tables is None
    for layer, window in enumerate(WINDOWS):
        want = attention_mask(t, start, window, "cpu")
        got = step.mask(layer)
        assert (got is None and want is None) or torch.equal(got, want)  # type: ignore[arg-type]


def test_layers_of_one_window_share_one_mask_computed_once() -> None:
    calls: list[int | None] = []
    cache = KVCache.allocate(3, 1, 2, 16, dtype=torch.float32, device="cpu")
    step = plan_step(cache, 4, WINDOWS, CPU)
    original = step.masks
    object.__setattr__(step, "masks", lambda w: calls.append(w) or original(w))
    assert step.mask(0) is step.mask(2)
    step.mask(1)
    assert calls == [None, 3]


@pytest.mark.parametrize("kind", ["static", "static-paged"])
@pytest.mark.parametrize(("pos", "t"), [(0, 5), (5, 1), (9, 2)])
def test_a_static_layout_plans_from_the_device_position(kind: str, pos: int, t: int) -> None:
    if kind == "static":
        cache: StaticKVCache | StaticPagedKVCache = StaticKVCache(torch.zeros(3, 2, 1, 16, 2), torch.zeros(3, 2, 1, 16, 2))
    else:
        pool = BlockPool.allocate(3, 1, 2, 8, 4, dtype=torch.float32, device="cpu")
        cache = StaticPagedKVCache(pool, 16, batch_size=2)
    cache.set_position(pos)
    step = plan_step(cache, t, WINDOWS, CPU)
    slots = 16
    assert step.static_shape
    assert torch.equal(step.positions, torch.arange(pos, pos + t))
    assert step.lengths is not None and step.lengths.tolist() == [pos + t, pos + t]
    if kind == "static":
        assert step.block_tables is None
    else:
        assert isinstance(cache, StaticPagedKVCache) and step.block_tables is cache.block_table
    for layer, window in enumerate(WINDOWS):
        mask = step.mask(layer)
        assert mask is not None and mask.shape == (t, slots)
        want = _dense(attention_mask(t, pos, window, "cpu"), t, pos + t)
        assert torch.equal(mask[:, : pos + t], want) and not mask[:, pos + t :].any()


def test_a_paged_view_plans_ragged_rows_with_their_tables_and_lengths() -> None:
    pool = BlockPool.allocate(3, 1, 2, 8, 2, dtype=torch.float32, device="cpu")
    ids = pool.acquire(5)  # the free list's head, in order: 0..4
    cache = PagedKVCache.over_blocks(pool, [ids[:2], ids[2:]], [3, 5])
    step = plan_step(cache, 1, WINDOWS, CPU)
    assert torch.equal(step.positions, torch.tensor([[3], [5]]))
    assert step.lengths is not None and step.lengths.tolist() == [4, 6]
    assert step.block_tables is not None and step.block_tables.tolist() == [[*ids[:2], -1], ids[2:]]
    mask = step.mask(1)  # window 3 over the longest row's 6 keys
    assert mask is not None and mask.shape == (2, 1, 6)
    assert mask[0, 0].tolist() == [False, True, True, True, False, False]
    assert mask[1, 0].tolist() == [False, False, False, True, True, True]


class _MinimalCache:
    """The protocol's minimum: no plan_step of its own."""

    seq_len = 2
    max_seq_len = 8
    num_layers = 3


def test_a_cache_without_its_own_planner_gets_the_contiguous_step() -> None:
    step = plan_step(_MinimalCache(), 2, WINDOWS, CPU)  # type: ignore[arg-type]
    assert torch.equal(step.positions, torch.tensor([2, 3]))
    assert torch.equal(step.mask(0), attention_mask(2, 2, None, "cpu"))  # type: ignore[arg-type]


def test_no_cache_plans_positions_from_zero() -> None:
    step = plan_step(None, 3, WINDOWS, CPU)
    assert torch.equal(step.positions, torch.arange(3))
    assert torch.equal(step.mask(1), attention_mask(3, 0, 3, "cpu"))  # type: ignore[arg-type]
