"""Snapshots: frozen copies, restore in place into any cache type, materialize, refusals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from infer_ref.cache import (
    BlockPool,
    DynamicKVCache,
    KVCache,
    KVCacheOverflowError,
    KVSnapshot,
    PagedKVCache,
    StaticKVCache,
)

L, B, H, D = 2, 2, 2, 4
F64 = torch.float64


def _contiguous(capacity: int = 16) -> KVCache:
    return KVCache.allocate(L, H, D, capacity, batch_size=B, dtype=F64, device="cpu")


def _static(capacity: int = 16) -> StaticKVCache:
    return StaticKVCache.allocate(L, H, D, capacity, batch_size=B, dtype=F64, device="cpu")


def _dynamic(capacity: int = 16) -> DynamicKVCache:
    return DynamicKVCache(L, H, D, batch_size=B, dtype=F64, device="cpu")


def _paged(capacity: int = 16, block_size: int = 3) -> PagedKVCache:
    blocks = B * -(-capacity // block_size)
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(capacity)).tolist()
    pool = BlockPool.allocate(L, H, D, blocks, block_size, dtype=F64, device="cpu", free_order=order)
    return PagedKVCache(pool, batch_size=B, max_seq_len=capacity)


FACTORIES: dict[str, Callable[..., Any]] = {
    "contiguous": _contiguous,
    "static": _static,
    "dynamic": _dynamic,
    "paged": _paged,
}


def _fill(cache: Any, t: int, seed: int) -> list[torch.Tensor]:
    """Write ``t`` positions to every layer (V = 2K) and advance; returns the K written per layer."""
    ks = []
    for layer in range(L):
        k = torch.randn(B, H, t, D, generator=torch.Generator().manual_seed(seed + layer), dtype=F64)
        cache.update(layer, k, 2 * k)
        ks.append(k)
    cache.advance(t)
    return ks


def _contents(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(t.clone() for t in cache.get_kv(i)) for i in range(L)]  # type: ignore[misc]


@pytest.mark.parametrize("source", FACTORIES)
@pytest.mark.parametrize("target", FACTORIES)
def test_restore_into_any_type_gives_identical_contents_and_next_update(source: str, target: str) -> None:
    src = FACTORIES[source]()
    _fill(src, 5, 0)
    snap = src.snapshot()
    dst = FACTORIES[target]()
    _fill(dst, 2, 77)  # something to be replaced
    dst.restore(snap)
    assert dst.seq_len == 5
    for (ka, va), (kb, vb) in zip(_contents(src), _contents(dst), strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    # The next write lands at position 5 in both, and both return identical K/V.
    k = torch.randn(B, H, 2, D, dtype=F64)
    ka, va = src.update(0, k, 2 * k)
    kb, vb = dst.update(0, k, 2 * k)
    n = 7
    assert torch.equal(ka[:, :, :n], kb[:, :, :n]) and torch.equal(va[:, :, :n], vb[:, :, :n])


@pytest.mark.parametrize("kind", FACTORIES)
def test_snapshot_is_frozen(kind: str) -> None:
    cache = FACTORIES[kind]()
    written = _fill(cache, 6, 0)
    snap = cache.snapshot()
    frozen = snap.keys.clone()
    # Everything that could reach a shallow copy: overwrite in place, crop, reset, reuse blocks.
    cache.crop(3)
    _fill(cache, 3, 500)
    cache.reset()
    _fill(cache, 9, 900)
    assert torch.equal(snap.keys, frozen)
    assert torch.equal(snap.keys[0], written[0])
    restored = snap.materialize()
    _fill(restored, 1, 3)
    restored.get_kv(0)[0].fill_(7.0)  # even a write through a returned view
    assert torch.equal(snap.keys, frozen)


@pytest.mark.parametrize("kind", FACTORIES)
def test_materialize_builds_the_same_type_with_the_same_capacity(kind: str) -> None:
    cache = FACTORIES[kind](capacity=12)
    _fill(cache, 4, 0)
    snap = cache.snapshot()
    twin = snap.materialize()
    assert type(twin) is type(cache)
    assert twin.seq_len == 4 and twin.max_seq_len == cache.max_seq_len
    assert all(torch.equal(a, b) for pa, pb in zip(_contents(cache), _contents(twin), strict=True) for a, b in zip(pa, pb, strict=True))


def test_static_restore_copies_in_place() -> None:
    cache = _static()
    _fill(cache, 3, 0)
    pointers = (cache.k.data_ptr(), cache.v.data_ptr(), cache.pos.data_ptr())
    other = _contiguous()
    _fill(other, 7, 40)
    cache.restore(other.snapshot())
    assert (cache.k.data_ptr(), cache.v.data_ptr(), cache.pos.data_ptr()) == pointers
    assert int(cache.pos) == 7 and cache.seq_len == 7


@pytest.mark.parametrize("kind", ["contiguous", "static", "paged"])
def test_snapshot_longer_than_capacity_is_refused_and_target_unchanged(kind: str) -> None:
    big = _dynamic()
    _fill(big, 10, 0)
    target = FACTORIES[kind](capacity=8)
    _fill(target, 4, 5)
    before = _contents(target)
    with pytest.raises(KVCacheOverflowError, match="10 positions"):
        target.restore(big.snapshot())
    assert target.seq_len == 4
    assert all(torch.equal(a, b) for pa, pb in zip(before, _contents(target), strict=True) for a, b in zip(pa, pb, strict=True))


def test_paged_restore_refused_when_the_pool_has_too_few_blocks() -> None:
    pool = BlockPool.allocate(L, H, D, 4, 3, dtype=F64, device="cpu")
    target = PagedKVCache(pool, batch_size=B, max_seq_len=100)
    other = _dynamic()
    _fill(other, 7, 0)  # needs 2 rows * 3 blocks
    with pytest.raises(KVCacheOverflowError, match="needs 6 blocks of 3"):
        target.restore(other.snapshot())
    assert pool.num_free == 4 and target.seq_len == 0


@pytest.mark.parametrize(
    ("snap", "error", "match"),
    [
        (lambda: KVSnapshot(torch.zeros(L, B, H + 1, 2, D, dtype=F64), torch.zeros(L, B, H + 1, 2, D, dtype=F64), KVCache, {}), ValueError, "geometry"),
        (lambda: KVSnapshot(torch.zeros(L, B, H, 2, D), torch.zeros(L, B, H, 2, D), KVCache, {}), TypeError, "never converts"),
        (lambda: "not a snapshot", TypeError, "needs a KVSnapshot"),
    ],
)
def test_mismatched_snapshots_are_refused(snap: Callable[[], Any], error: type[Exception], match: str) -> None:
    target = _contiguous()
    _fill(target, 3, 0)
    before = _contents(target)
    with pytest.raises(error, match=match):
        target.restore(snap())
    assert target.seq_len == 3 and all(torch.equal(a, b) for pa, pb in zip(before, _contents(target), strict=True) for a, b in zip(pa, pb, strict=True))
