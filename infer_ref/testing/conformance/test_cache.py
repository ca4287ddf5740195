"""KV cache invariants, for any cache an adapter can make.

Expected contents come from a plain Python record of what was written (the oracle is the list of
writes itself), never from the cache. Cache data is compared bitwise: a cache stores, it computes
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from infer_ref.testing import strategies as irst
from infer_ref.testing.adapter import Adapter, CacheSpec
from infer_ref.testing.assertions import assert_equal, fail

pytestmark = pytest.mark.ir_requires("cache")

# What a precise error may be: never a bare RuntimeError from an indexing accident.
CACHE_ERRORS = (ValueError, IndexError, TypeError)


def entries(spec: CacheSpec, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Distinct random K and V ``[B, Hkv, n, D]`` in the cache's dtype."""
    g = torch.Generator().manual_seed(seed)
    shape = spec.entry_shape(n)
    k = torch.randn(shape, generator=g, dtype=torch.float64).to(spec.dtype)
    v = torch.randn(shape, generator=g, dtype=torch.float64).to(spec.dtype)
    return k.to(spec.device), v.to(spec.device)


class Record:
    """What each layer should hold: the concatenation of everything written to it."""

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self.k: list[list[Tensor]] = [[] for _ in range(spec.num_layers)]
        self.v: list[list[Tensor]] = [[] for _ in range(spec.num_layers)]

    def expected(self, layer: int, extra: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        ks, vs = list(self.k[layer]), list(self.v[layer])
        if extra is not None:
            ks.append(extra[0])
            vs.append(extra[1])
        empty = torch.empty(self.spec.entry_shape(0), dtype=self.spec.dtype, device=self.spec.device)
        return torch.cat([empty, *ks], dim=2), torch.cat([empty, *vs], dim=2)


def check_all_layers(adapter: Adapter, cache: Any, record: Record, params: dict[str, Any], when: str) -> None:
    assert adapter.read_cache is not None
    for layer in range(record.spec.num_layers):
        k, v = adapter.read_cache(cache, layer)
        ek, ev = record.expected(layer)
        assert_equal(k, ek, what=f"K of layer {layer} {when}", params=params)
        assert_equal(v, ev, what=f"V of layer {layer} {when}", params=params)


def make(adapter: Adapter, spec: CacheSpec) -> Any:
    assert adapter.make_cache is not None
    return adapter.make_cache(spec)


def fill(adapter: Adapter, cache: Any, spec: CacheSpec, record: Record, chunks: list[int], seed: int) -> None:
    """Write every layer chunk by chunk, advancing once per chunk (as a model does)."""
    for c, n in enumerate(chunks):
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            cache.update(layer, k, v)
            record.k[layer].append(k)
            record.v[layer].append(v)
        cache.advance(n)


@st.composite
def cache_cases(draw: st.DrawFn, dtypes: st.SearchStrategy[torch.dtype] | None = None) -> tuple[CacheSpec, list[int]]:
    dims = draw(irst.cache_dims())
    total = draw(st.integers(1, 24))
    slack = draw(st.integers(0, 4))
    dtype = draw(dtypes if dtypes is not None else irst.dtypes())
    spec = CacheSpec(dims.num_layers, dims.batch_size, dims.num_kv_heads, dims.head_dim, total + slack, dtype)
    return spec, draw(irst.chunkings(total))


@given(case=cache_cases(), seed=st.integers(0, 1000))
def test_update_writes_at_seq_len_and_returns_the_prefix(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], seed: int) -> None:
    """Each write lands at ``[seq_len, seq_len + n)`` and ``update`` returns exactly ``[0, seq_len + n)``.

    Guards: *unwritten cache slots attended* (a returned view longer than what was written) and
    *advance skipped or doubled* (seq_len not moving by exactly n).
    """
    spec, chunks = case
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    pos = 0
    for c, n in enumerate(chunks):
        if cache.seq_len != pos:
            fail(f"seq_len is {cache.seq_len} after writing {pos} positions", params=params)
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            got_k, got_v = cache.update(layer, k, v)
            ek, ev = record.expected(layer, (k, v))
            assert_equal(got_k, ek, what=f"K returned by update(layer {layer}) for chunk {c}", params=params)
            assert_equal(got_v, ev, what=f"V returned by update(layer {layer}) for chunk {c}", params=params)
            record.k[layer].append(k)
            record.v[layer].append(v)
        cache.advance(n)
        pos += n
    if cache.seq_len != pos:
        fail(f"seq_len is {cache.seq_len} after writing {pos} positions", params=params)


@given(case=cache_cases(), seed=st.integers(0, 1000))
def test_earlier_positions_never_change(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], seed: int) -> None:
    """After every chunk, every layer holds exactly what was written to it, in order.

    Guards: *layers aliasing one cache slice*, writes landing at the wrong offset, and any write
    that disturbs positions already filled.
    """
    spec, chunks = case
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    for c, n in enumerate(chunks):
        fill(ir_adapter, cache, spec, record, [n], seed * 100 + c)
        check_all_layers(ir_adapter, cache, record, params, f"after chunk {c}")


@given(case=cache_cases(dtypes=irst.dtypes(low_precision=False)), order=st.randoms(use_true_random=False), seed=st.integers(0, 1000))
def test_layers_and_batch_rows_are_isolated(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], order: Any, seed: int) -> None:
    """Layers written in any order, with a distinct constant per (layer, batch row), each read back
    only its own values.

    Guards: *layers aliasing one cache slice* (one layer's write shows up in another) and batch
    rows mixed up by a wrong broadcast or index.
    """
    spec, chunks = case
    params = {"spec": spec, "chunks": chunks}
    cache = make(ir_adapter, spec)
    assert ir_adapter.read_cache is not None
    for n in chunks:
        layers = list(range(spec.num_layers))
        order.shuffle(layers)
        for layer in layers:
            tag = torch.tensor([1000.0 * (layer + 1) + b for b in range(spec.batch_size)], dtype=spec.dtype)
            k = tag.view(-1, 1, 1, 1).expand(spec.entry_shape(n)).clone()
            cache.update(layer, k, -k)
        cache.advance(n)
    for layer in range(spec.num_layers):
        k, v = ir_adapter.read_cache(cache, layer)
        for b in range(spec.batch_size):
            want = torch.full(spec.entry_shape(cache.seq_len)[1:], 1000.0 * (layer + 1) + b, dtype=spec.dtype)
            assert_equal(k[b], want, what=f"K of layer {layer}, batch row {b}", params=params)
            assert_equal(v[b], -want, what=f"V of layer {layer}, batch row {b}", params=params)


@given(case=cache_cases(), extra=st.integers(1, 5), seed=st.integers(0, 1000))
def test_overflow_raises_and_leaves_state_unchanged(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], extra: int, seed: int) -> None:
    """A write or advance past ``max_seq_len`` raises an error naming the capacity and changes nothing;
    filling exactly to capacity still works.

    Guards: *overflow clamped silently* (truncated writes, a saturating seq_len).
    """
    spec, chunks = case
    params = {"spec": spec, "chunks": chunks, "extra": extra}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, cache, spec, record, chunks, seed)
    filled = cache.seq_len
    too_many = spec.max_seq_len - filled + extra
    k, v = entries(spec, too_many, seed + 7)
    for layer in range(spec.num_layers):
        with pytest.raises(CACHE_ERRORS) as err:
            cache.update(layer, k, v)
        if str(spec.max_seq_len) not in str(err.value):
            fail(f"overflow error does not name the capacity {spec.max_seq_len}: {err.value!r}", params=params)
        if cache.seq_len != filled:
            fail(f"a refused write moved seq_len from {filled} to {cache.seq_len}", params=params)
        check_all_layers(ir_adapter, cache, record, params, f"after a refused write to layer {layer}")
    with pytest.raises(CACHE_ERRORS) as err:
        cache.advance(too_many)
    if str(spec.max_seq_len) not in str(err.value):
        fail(f"advance overflow error does not name the capacity {spec.max_seq_len}: {err.value!r}", params=params)
    if cache.seq_len != filled:
        fail(f"a refused advance moved seq_len from {filled} to {cache.seq_len}", params=params)
    check_all_layers(ir_adapter, cache, record, params, "after a refused advance")
    remaining = spec.max_seq_len - filled
    if remaining:
        fill(ir_adapter, cache, spec, record, [remaining], seed + 11)
        check_all_layers(ir_adapter, cache, record, params, "after filling to capacity")
    if cache.seq_len != spec.max_seq_len:
        fail(f"seq_len {cache.seq_len} after filling to capacity {spec.max_seq_len}", params=params)


@pytest.mark.ir_requires("cache.capacity")
@given(case=cache_cases())
def test_capacity_helpers_track_seq_len(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]]) -> None:
    """``remaining_capacity == max_seq_len - seq_len`` and ``is_full`` iff nothing remains, at every step.

    Guards: *overflow clamped silently* (an engine that trusts remaining_capacity to refuse work).
    """
    spec, chunks = case
    cache = make(ir_adapter, spec)
    record = Record(spec)
    for n in [0, *chunks]:
        if n:
            fill(ir_adapter, cache, spec, record, [n], n)
        if cache.max_seq_len != spec.max_seq_len or cache.remaining_capacity != spec.max_seq_len - cache.seq_len:
            fail(
                f"max_seq_len {cache.max_seq_len}, remaining_capacity {cache.remaining_capacity} at seq_len {cache.seq_len}",
                params={"spec": spec, "chunks": chunks},
            )
        if bool(cache.is_full) != (cache.seq_len == spec.max_seq_len):
            fail(f"is_full is {cache.is_full} at seq_len {cache.seq_len} of {spec.max_seq_len}", params={"spec": spec})


@pytest.mark.ir_requires("cache.reset")
@given(case=cache_cases(), second=st.integers(1, 8), seed=st.integers(0, 1000))
def test_reset_restarts_at_zero(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], second: int, seed: int) -> None:
    """After ``reset`` the cache is empty: seq_len 0, and the next request's writes are all it returns.

    Guards: *cache not reset between requests*.
    """
    spec, chunks = case
    second = min(second, spec.max_seq_len)
    params = {"spec": spec, "chunks": chunks, "second": second}
    cache = make(ir_adapter, spec)
    fill(ir_adapter, cache, spec, Record(spec), chunks, seed)
    cache.reset()
    if cache.seq_len != 0:
        fail(f"seq_len is {cache.seq_len} after reset, expected 0", params=params)
    record = Record(spec)
    for layer in range(spec.num_layers):
        k, v = entries(spec, second, seed + 500 + layer)
        got_k, got_v = cache.update(layer, k, v)
        assert_equal(got_k, k, what=f"K returned by the first update after reset (layer {layer})", params=params)
        assert_equal(got_v, v, what=f"V returned by the first update after reset (layer {layer})", params=params)
        record.k[layer].append(k)
        record.v[layer].append(v)
    cache.advance(second)
    check_all_layers(ir_adapter, cache, record, params, "after reset and a new request")


@pytest.mark.ir_requires("cache.reset", "cache.storage")
@given(case=cache_cases(), seed=st.integers(0, 1000))
def test_reset_zeroes_storage(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], seed: int) -> None:
    """``reset`` zeroes every tensor behind a pre-allocated cache (no stale K/V survives a request).

    Guards: *cache not reset between requests* (stale data read by an engine that slices the raw buffer).
    """
    spec, chunks = case
    cache = make(ir_adapter, spec)
    fill(ir_adapter, cache, spec, Record(spec), chunks, seed)
    cache.reset()
    assert ir_adapter.cache_storage is not None
    for i, t in enumerate(ir_adapter.cache_storage(cache)):
        if bool(t.ne(0).any()):
            fail(f"storage tensor {i} has {int(t.ne(0).sum())} non-zero elements after reset", params={"spec": spec})


@pytest.mark.ir_requires("cache.memory_bytes")
@given(dims=irst.cache_dims(), capacity=st.integers(1, 64), dtype=irst.dtypes())
def test_memory_bytes_is_the_formula(ir_adapter: Adapter, dims: irst.CacheDims, capacity: int, dtype: torch.dtype) -> None:
    """``memory_bytes == 2 * L * B * Hkv * S * D * itemsize`` for a pre-allocated cache.

    Guards: capacity planning that under- or over-counts (seed 000's table was wrong for two models).
    """
    spec = CacheSpec(dims.num_layers, dims.batch_size, dims.num_kv_heads, dims.head_dim, capacity, dtype)
    cache = make(ir_adapter, spec)
    if cache.memory_bytes != spec.expected_memory_bytes:
        fail(f"memory_bytes {cache.memory_bytes} != 2*L*B*Hkv*S*D*itemsize = {spec.expected_memory_bytes}", params={"spec": spec})


@given(case=cache_cases(), seed=st.integers(0, 1000))
def test_dtype_and_device_preserved(ir_adapter: Adapter, case: tuple[CacheSpec, list[int]], seed: int) -> None:
    """Views from ``update`` and ``read_cache`` keep the cache's dtype and device (no silent upcast
    or host copy), and values round-trip bit for bit in every dtype."""
    spec, chunks = case
    cache = make(ir_adapter, spec)
    assert ir_adapter.read_cache is not None
    k, v = entries(spec, chunks[0], seed)
    for layer in range(spec.num_layers):
        for name, t in zip(("K", "V"), cache.update(layer, k, v), strict=True):
            if t.dtype != spec.dtype or t.device != torch.device(spec.device):
                fail(f"update returned {name} as {t.dtype} on {t.device}, cache is {spec.dtype} on {spec.device}", params={"spec": spec})
    cache.advance(chunks[0])
    for layer in range(spec.num_layers):
        rk, rv = ir_adapter.read_cache(cache, layer)
        assert_equal(rk, k, what=f"K read back from layer {layer}", params={"spec": spec})
        assert_equal(rv, v, what=f"V read back from layer {layer}", params={"spec": spec})


# -- every documented error case -----------------------------------------------------------------

SPEC = CacheSpec(num_layers=2, batch_size=2, num_kv_heads=2, head_dim=4, max_seq_len=8, dtype=torch.float32)


def _bad(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, device: str = "cpu") -> Tensor:
    return torch.ones(shape, dtype=dtype, device=device)


_OK = (2, 2, 1, 4)
ERROR_CASES: dict[str, tuple[Any, tuple[str, ...]]] = {
    # name: (call on the cache, substrings the message must contain: one of each tuple entry group)
    "advance zero": (lambda c: c.advance(0), ("0",)),
    "advance negative": (lambda c: c.advance(-2), ("-2",)),
    "advance non-integer": (lambda c: c.advance(1.5), ("1.5",)),
    "advance past capacity": (lambda c: c.advance(6), ("8",)),
    "write past capacity": (lambda c: c.update(0, _bad((2, 2, 6, 4)), _bad((2, 2, 6, 4))), ("8",)),
    "layer index negative": (lambda c: c.update(-1, _bad(_OK), _bad(_OK)), ("-1",)),
    "layer index too large": (lambda c: c.update(2, _bad(_OK), _bad(_OK)), ("2",)),
    "wrong batch": (lambda c: c.update(0, _bad((3, 2, 1, 4)), _bad((3, 2, 1, 4))), ("3, 2, 1, 4",)),
    "wrong kv heads": (lambda c: c.update(0, _bad((2, 1, 1, 4)), _bad((2, 1, 1, 4))), ("2, 1, 1, 4",)),
    "wrong head_dim": (lambda c: c.update(0, _bad((2, 2, 1, 3)), _bad((2, 2, 1, 3))), ("2, 2, 1, 3",)),
    "3-D entries": (lambda c: c.update(0, _bad((2, 1, 4)), _bad((2, 1, 4))), ("2, 1, 4",)),
    "empty write": (lambda c: c.update(0, _bad((2, 2, 0, 4)), _bad((2, 2, 0, 4))), ("2, 2, 0, 4",)),
    "k and v shapes differ": (lambda c: c.update(0, _bad((2, 2, 1, 4)), _bad((2, 2, 2, 4))), ("2, 2, 2, 4",)),
    "dtype mismatch": (lambda c: c.update(0, _bad(_OK, torch.float64), _bad(_OK, torch.float64)), ("float64",)),
    "v dtype mismatch": (lambda c: c.update(0, _bad(_OK), _bad(_OK, torch.bfloat16)), ("bfloat16",)),
    "device mismatch": (lambda c: c.update(0, _bad(_OK, device="meta"), _bad(_OK, device="meta")), ("meta",)),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_error_case_raises_precisely_and_changes_nothing(ir_adapter: Adapter, case: str) -> None:
    """Each misuse DESIGN.md lists raises ValueError / IndexError / TypeError whose message names the
    offending value, and leaves seq_len and every layer's contents as they were.

    Guards: *overflow clamped silently*, negative layer indices aliasing the last layer, and
    half-applied writes (state changed before the error).
    """
    call, needles = ERROR_CASES[case]
    cache = make(ir_adapter, SPEC)
    record = Record(SPEC)
    fill(ir_adapter, cache, SPEC, record, [3], seed=5)
    with pytest.raises(CACHE_ERRORS) as err:
        call(cache)
    message = str(err.value)
    for needle in needles:
        if needle not in message:
            fail(f"{case}: error message does not name {needle!r}: {type(err.value).__name__}: {message}", params={"case": case})
    if cache.seq_len != 3:
        fail(f"{case}: seq_len moved from 3 to {cache.seq_len}", params={"case": case})
    check_all_layers(ir_adapter, cache, record, {"case": case}, f"after the refused call ({case})")
