"""KV-cache counters and layer indices: an advance past what every layer wrote, a negative host
advance, a layer index of the wrong type. Each is refused naming the value, and the cache (length,
device position, contents) is as it was.

Which caches check the writes behind an advance: the host-counted ones whose ``advance`` is a
separate call (``KVCache``, ``PagedKVCache``; ``DynamicKVCache`` always did). The static caches keep the position on
the device and their ``advance`` is captured inside a CUDA graph, so they are not checked there
(no host work per step); their host counter ``advance_host`` still refuses a non-positive count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from infer_ref.cache import BlockPool, DynamicKVCache, KVCache, PagedKVCache, StaticKVCache
from infer_ref.cache.factory import CACHE_KINDS, build_cache
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config

LAYERS, HEADS, DIM = 2, 2, 4


def _entries(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, HEADS, t, DIM, generator=g)  # [B, Hkv, T, D]
    return k, -k


def _contiguous() -> KVCache:
    return KVCache.allocate(LAYERS, HEADS, DIM, 8, dtype=torch.float32, device="cpu")


def _dynamic() -> DynamicKVCache:
    return DynamicKVCache(LAYERS, HEADS, DIM, dtype=torch.float32, device="cpu")


def _paged() -> PagedKVCache:
    pool = BlockPool.allocate(LAYERS, HEADS, DIM, 4, 2, dtype=torch.float32, device="cpu")  # 4 blocks of 2
    return PagedKVCache(pool, max_seq_len=8)


HOST_COUNTED = [
    pytest.param(_contiguous, id="contiguous"),
    pytest.param(_dynamic, id="dynamic"),
    pytest.param(_paged, id="paged"),
]


def _state(cache: Any) -> tuple[int, list[torch.Tensor]]:
    """The length and every layer's K and V (owned copies)."""
    held = [t.clone() for layer in range(cache.num_layers) for t in cache.get_kv(layer)]
    return cache.seq_len, held


def _assert_state(cache: Any, before: tuple[int, list[torch.Tensor]]) -> None:
    seq_len, held = before
    assert cache.seq_len == seq_len
    now = [t for layer in range(cache.num_layers) for t in cache.get_kv(layer)]
    assert len(now) == len(held) and all(torch.equal(a, b) for a, b in zip(now, held, strict=True))


# -- advance past what every layer wrote ------------------------------------------------------------


@pytest.mark.parametrize("make", HOST_COUNTED)
def test_cache_advance_without_any_write_is_refused(make: Any) -> None:
    cache = make()
    before = _state(cache)
    with pytest.raises(ValueError, match=r"advance\(2\) from 0 needs every layer") as info:
        cache.advance(2)
    assert "[0, 1]" in str(info.value)
    _assert_state(cache, before)
    assert before[0] == 0


@pytest.mark.parametrize("make", HOST_COUNTED)
def test_cache_advance_two_after_a_write_of_one_is_refused(make: Any) -> None:
    cache = make()
    written = [_entries(1, seed=layer) for layer in range(LAYERS)]
    for layer, (k, v) in enumerate(written):
        cache.update(layer, k, v)
    before = _state(cache)
    with pytest.raises(ValueError, match=r"advance\(2\) from 0 needs every layer") as info:
        cache.advance(2)
    assert "[0, 1]" in str(info.value)
    _assert_state(cache, before)
    # The write itself is kept: committing the one position written shows exactly it.
    cache.advance(1)
    assert cache.seq_len == 1
    for layer, (k, v) in enumerate(written):
        held_k, held_v = cache.get_kv(layer)
        assert torch.equal(held_k, k) and torch.equal(held_v, v)


@pytest.mark.parametrize("make", HOST_COUNTED)
def test_cache_advance_with_one_layer_unwritten_names_that_layer(make: Any) -> None:
    cache = make()
    cache.update(0, *_entries(3, seed=1))
    cache.update(1, *_entries(3, seed=2))
    cache.advance(3)
    cache.update(1, *_entries(2, seed=3))  # layer 0 never wrote positions 3..4
    before = _state(cache)
    with pytest.raises(ValueError, match=r"advance\(2\) from 3") as info:
        cache.advance(2)
    assert "layer(s) [0]" in str(info.value)
    _assert_state(cache, before)


@pytest.mark.parametrize("make", HOST_COUNTED)
def test_cache_advance_over_cropped_positions_is_refused(make: Any) -> None:
    """A crop drops positions: advancing back over them without writing them again is refused."""
    cache = make()
    for layer in range(LAYERS):
        cache.update(layer, *_entries(4, seed=layer))
    cache.advance(4)
    cache.crop(2)
    before = _state(cache)
    with pytest.raises(ValueError, match=r"advance\(1\) from 2"):
        cache.advance(1)
    _assert_state(cache, before)


def test_cache_advance_after_reset_is_refused() -> None:
    cache = _contiguous()
    for layer in range(LAYERS):
        cache.update(layer, *_entries(4, seed=layer))
    cache.advance(4)
    cache.reset()
    with pytest.raises(ValueError, match=r"advance\(4\) from 0"):
        cache.advance(4)
    assert cache.seq_len == 0 and not cache.k.any() and not cache.v.any()


def test_cache_advance_after_restore_takes_the_snapshot_positions() -> None:
    """A restored cache holds the snapshot's positions in every layer: nothing more may be advanced over."""
    source = _contiguous()
    for layer in range(LAYERS):
        source.update(layer, *_entries(3, seed=layer))
    source.advance(3)
    cache = _contiguous()
    cache.restore(source.snapshot())
    with pytest.raises(ValueError, match=r"advance\(1\) from 3"):
        cache.advance(1)
    assert cache.seq_len == 3
    cache.update(0, *_entries(1, seed=7))
    cache.update(1, *_entries(1, seed=8))
    cache.advance(1)
    assert cache.seq_len == 4


def test_cache_overflow_is_still_reported_as_overflow() -> None:
    """Past the capacity the overflow error comes first (it names max_seq_len), written or not."""
    from infer_ref.cache import KVCacheOverflowError

    cache = _contiguous()
    with pytest.raises(KVCacheOverflowError, match="max_seq_len is 8"):
        cache.advance(9)
    assert cache.seq_len == 0


# -- the static cache's host counter ----------------------------------------------------------------


@pytest.mark.parametrize("n", [-3, 0, 1.0, True, "1"], ids=["negative", "zero", "float", "bool", "str"])
def test_cache_static_advance_host_refuses_a_non_positive_count(n: Any) -> None:
    cache = StaticKVCache(torch.zeros(LAYERS, 1, HEADS, 8, DIM), torch.zeros(LAYERS, 1, HEADS, 8, DIM))
    cache.set_position(2)
    with pytest.raises(ValueError, match=r"advance_host\(n\) needs a positive integer n") as info:
        cache.advance_host(n)
    assert repr(n) in str(info.value)
    assert cache.seq_len == 2 and int(cache.pos) == 2 and cache.remaining_capacity == 6


# -- layer indices of the wrong type -----------------------------------------------------------------


WRONG_TYPES = [
    pytest.param(np.int64(0), "numpy.int64", id="numpy-int64"),
    pytest.param(np.int32(1), "numpy.int32", id="numpy-int32"),
    pytest.param(torch.tensor(0), "torch.Tensor", id="tensor-0d"),
    pytest.param(1.0, "float", id="float"),
]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize(("layer", "type_name"), WRONG_TYPES)
def test_cache_layer_index_of_the_wrong_type_is_named_as_such(kind: str, layer: Any, type_name: str) -> None:
    config = ModelConfig.from_hf_dict(tiny_config("llama"))
    cache = build_cache(kind, config, 16, dtype=torch.float32, device="cpu")
    k = torch.ones(1, cache.num_kv_heads, 1, cache.head_dim)  # [B, Hkv, 1, D]
    before = _state(cache)
    with pytest.raises(TypeError) as info:
        cache.update(layer, k, k)
    message = str(info.value)
    assert f"is a {type_name}" in message and "expected a Python int in 0..1" in message, message
    assert "out of range" not in message
    _assert_state(cache, before)
    with pytest.raises(TypeError, match=f"is a {type_name}"):
        cache.get_kv(layer)
