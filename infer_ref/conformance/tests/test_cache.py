"""KV cache invariants, for any cache an adapter can make, whatever its contract.

Expected contents come from a plain Python record of what was written (the oracle is the list of
writes itself), never from the cache. Cache data is compared bitwise: a cache stores, it computes
nothing. Every length read, advance and returned view goes through the adapter's
:class:`~infer_ref.conformance.interface.contract.CacheContract` (explicit ``advance`` or per-layer lengths moved
inside ``update``; an exact prefix or a static buffer returned; sliding-window layers that keep
only their last ``window`` positions).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_equal, fail, note
from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import (
    Unsupported,
    as_held,
    commit,
    layer_length,
    state_of,
    written,
)

pytestmark = pytest.mark.ir_requires("cache")


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


def _rows(t: Tensor) -> Tensor:
    """``[B, H, S, D]`` -> ``[S, B*H*D]`` on the CPU: one row per position, for set comparisons."""
    return t.detach().to("cpu").permute(2, 0, 1, 3).reshape(t.shape[2], -1)


def check_window_view(got: Tensor, want: Tensor, *, what: str, params: dict[str, Any]) -> None:
    """Every position ``want`` holds (in order) appears in ``got`` (any order): a window layer's view."""
    have = _rows(got)
    for i, row in enumerate(_rows(want)):
        if not bool((have == row).all(dim=1).any()):
            fail(f"{what}: position {i} of the {want.shape[2]} the chunk needs is missing from the returned view", params=params)


def check_layer(adapter: Adapter, cache: Any, record: Record, layer: int, params: dict[str, Any], when: str) -> None:
    """``read_cache`` of one layer against the record: all positions, or a window's last ones with their positions."""
    assert adapter.read_cache is not None
    ek, ev = record.expected(layer)
    k, v, pos = as_held(adapter.read_cache(cache, layer), ek.shape[2])
    window = record.spec.window(layer)
    if window is None:
        assert_equal(k, ek, what=f"K of layer {layer} {when}", params=params)
        assert_equal(v, ev, what=f"V of layer {layer} {when}", params=params)
        return
    length = ek.shape[2]
    must_hold = set(range(max(0, length - window), length))
    held = [int(p) for p in pos]
    if not must_hold <= set(held) or any(not 0 <= p < length for p in held):
        fail(f"window layer {layer} (window {window}) {when} holds positions {sorted(held)}; it must hold {sorted(must_hold)} and nothing unwritten", params=params)
    order = torch.tensor(held, dtype=torch.long)
    assert_equal(k.to("cpu"), ek.to("cpu")[:, :, order], what=f"K held by window layer {layer} {when}", params=params)
    assert_equal(v.to("cpu"), ev.to("cpu")[:, :, order], what=f"V held by window layer {layer} {when}", params=params)


def check_all_layers(adapter: Adapter, cache: Any, record: Record, params: dict[str, Any], when: str) -> None:
    for layer in range(record.spec.num_layers):
        check_layer(adapter, cache, record, layer, params, when)


def check_lengths(adapter: Adapter, cache: Any, spec: CacheSpec, want: int, params: dict[str, Any], when: str) -> None:
    lengths = state_of(adapter.cache_contract, cache, spec.num_layers)
    if any(n != want for n in lengths):
        fail(f"layer lengths {lengths} {when}, expected {want} in every layer", params=params)


def make(adapter: Adapter, spec: CacheSpec) -> Any:
    assert adapter.make_cache is not None
    return adapter.make_cache(spec)


def fill(adapter: Adapter, cache: Any, spec: CacheSpec, record: Record, chunks: list[int], seed: int) -> None:
    """Write every layer chunk by chunk, committing once per chunk (as a model does)."""
    for c, n in enumerate(chunks):
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            cache.update(layer, k, v)
            record.k[layer].append(k)
            record.v[layer].append(v)
        commit(adapter.cache_contract, cache, n)


@st.composite
def cache_cases(
    draw: st.DrawFn, device: str = "cpu", dtypes: st.SearchStrategy[torch.dtype] | None = None, windows: bool = False
) -> tuple[CacheSpec, list[int]]:
    """A cache geometry on ``device`` and a chunking; with ``windows``, per-layer windows (some None)."""
    dims = draw(irst.cache_dims())
    total = draw(st.integers(1, 24))
    slack = draw(st.integers(0, 4))
    dtype = draw(dtypes if dtypes is not None else irst.dtypes())
    layer_windows = None
    if windows:
        layer_windows = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 8)), min_size=dims.num_layers, max_size=dims.num_layers)))
    spec = CacheSpec(dims.num_layers, dims.batch_size, dims.num_kv_heads, dims.head_dim, total + slack, dtype, device, layer_windows)
    return spec, draw(irst.chunkings(total))


def draw_case(data: st.DataObject, adapter: Adapter, device: str, **kw: Any) -> tuple[CacheSpec, list[int]]:
    return data.draw(cache_cases(device, windows=adapter.cache_contract.windows, **kw), label="case")


@given(data=st.data(), seed=st.integers(0, 1000))
def test_update_writes_at_the_layer_length_and_returns_what_was_written(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """Each write lands at ``[length, length + n)`` and ``update`` returns exactly ``[0, length + n)``
    (a static buffer: its first ``length + n`` positions; a window layer: at least the positions the
    chunk's queries need).

    Guards: *unwritten cache slots attended* (a returned view longer than what was written),
    *advance skipped or doubled* (a length not moving by exactly n) and *decode slot off by one in
    the block table* (a write landing one slot early).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    contract = ir_adapter.cache_contract
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    pos = 0
    for c, n in enumerate(chunks):
        check_lengths(ir_adapter, cache, spec, pos, params, f"after writing {pos} positions")
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            got_k, got_v = cache.update(layer, k, v)
            ek, ev = record.expected(layer, (k, v))
            window = spec.window(layer)
            if window is None:
                got_k, got_v = written(contract, got_k, pos + n), written(contract, got_v, pos + n)
                assert_equal(got_k, ek, what=f"K returned by update(layer {layer}) for chunk {c}", params=params)
                assert_equal(got_v, ev, what=f"V returned by update(layer {layer}) for chunk {c}", params=params)
            else:
                need = slice(max(0, pos - window + 1), pos + n)  # keys the chunk's queries see
                check_window_view(got_k, ek[:, :, need], what=f"K returned by update(window layer {layer}) for chunk {c}", params=params)
                check_window_view(got_v, ev[:, :, need], what=f"V returned by update(window layer {layer}) for chunk {c}", params=params)
            record.k[layer].append(k)
            record.v[layer].append(v)
        commit(contract, cache, n)
        pos += n
    check_lengths(ir_adapter, cache, spec, pos, params, f"after writing {pos} positions")


@given(data=st.data(), seed=st.integers(0, 1000))
def test_earlier_positions_never_change(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """After every chunk, every layer holds exactly what was written to it, in order (a window
    layer: its last ``window`` positions, at their positions).

    Guards: *layers aliasing one cache slice*, writes landing at the wrong offset, and any write
    that disturbs positions already filled.
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    for c, n in enumerate(chunks):
        fill(ir_adapter, cache, spec, record, [n], seed * 100 + c)
        check_all_layers(ir_adapter, cache, record, params, f"after chunk {c}")


@given(data=st.data(), prefill=st.integers(1, 9), steps=st.integers(1, 6), seed=st.integers(0, 1000))
def test_each_single_token_step_lands_at_the_layer_length(
    ir_adapter: Adapter, ir_device: str, data: st.DataObject, prefill: int, steps: int, seed: int
) -> None:
    """A prefill, then single-token steps (a decode): after each step, every layer read back with
    ``read_cache`` holds exactly what was written, the new token at the position after the ones
    before it. Only what the cache stores is read (never ``update``'s returned view, never
    attention over it), so an over-long view or a read past the written slots cannot fail this test.

    Guards: *decode slot off by one in the block table* (a decode token written over its
    predecessor, its own slot left unwritten).
    """
    spec, _ = draw_case(data, ir_adapter, ir_device)
    spec = replace(spec, max_seq_len=prefill + steps)
    params = {"spec": spec, "prefill": prefill, "steps": steps, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, cache, spec, record, [prefill], seed * 100)
    for step in range(steps):
        fill(ir_adapter, cache, spec, record, [1], seed * 100 + 1 + step)
        check_all_layers(ir_adapter, cache, record, params, f"after decode step {step} (position {prefill + step})")


@given(data=st.data(), order=st.randoms(use_true_random=False))
def test_layers_and_batch_rows_are_isolated(ir_adapter: Adapter, ir_device: str, data: st.DataObject, order: Any) -> None:
    """Layers written in any order, with a distinct constant per (layer, batch row), each read back
    only its own values.

    Guards: *layers aliasing one cache slice* (one layer's write shows up in another) and batch
    rows mixed up by a wrong broadcast or index.
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device, dtypes=irst.dtypes(low_precision=False))
    params = {"spec": spec, "chunks": chunks}
    cache = make(ir_adapter, spec)
    assert ir_adapter.read_cache is not None
    for n in chunks:
        layers = list(range(spec.num_layers))
        order.shuffle(layers)
        for layer in layers:
            tag = torch.tensor([1000.0 * (layer + 1) + b for b in range(spec.batch_size)], dtype=spec.dtype, device=spec.device)
            k = tag.view(-1, 1, 1, 1).expand(spec.entry_shape(n)).clone()
            cache.update(layer, k, -k)
        commit(ir_adapter.cache_contract, cache, n)
    for layer in range(spec.num_layers):
        k, v, _ = as_held(ir_adapter.read_cache(cache, layer), sum(chunks))
        for b in range(spec.batch_size):
            want = torch.full((spec.num_kv_heads, k.shape[2], spec.head_dim), 1000.0 * (layer + 1) + b, dtype=spec.dtype, device=k.device)
            assert_equal(k[b], want, what=f"K of layer {layer}, batch row {b}", params=params)
            assert_equal(v[b], -want, what=f"V of layer {layer}, batch row {b}", params=params)


def refused(adapter: Adapter, call: Any) -> BaseException | None:
    """Run a call that must be refused; return what it raised (None: it was accepted)."""
    try:
        call()
    except Unsupported:
        raise  # refused by design: the draw is rejected, not judged
    except Exception as exc:  # judged after the state check, by refusal_verdict
        return exc
    return None


def refusal_verdict(adapter: Adapter, err: BaseException | None, what: str, needles: tuple[str, ...], params: dict[str, Any]) -> None:
    """The state was already found unchanged; now: was it refused, with an error of the documented family?

    Message wording is reported (a note in the report), never required.
    """
    family = adapter.cache_contract.error_types
    if err is None:
        fail(f"{what}: accepted without an error (state unchanged, but nothing refused it)", params=params)
    if not isinstance(err, family):
        fail(f"{what}: raised {type(err).__name__}: {err}; the documented family is {', '.join(t.__name__ for t in family)}", params=params)
    missing = [n for n in needles if n not in str(err)]
    if missing:
        note(f"{what}: the {type(err).__name__} message does not name {', '.join(map(repr, missing))}: {err}")


@pytest.mark.ir_requires("cache.errors", "cache.bounded")
@given(data=st.data(), extra=st.integers(1, 5), seed=st.integers(0, 1000))
def test_overflow_is_refused_and_changes_nothing(ir_adapter: Adapter, ir_device: str, data: st.DataObject, extra: int, seed: int) -> None:
    """A write (or advance) past ``max_seq_len`` is refused and changes nothing — lengths and every
    layer's contents are checked first, the error family second; filling exactly to capacity still works.

    Guards: *overflow clamped silently* (truncated writes, a saturating length).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    contract = ir_adapter.cache_contract
    params = {"spec": spec, "chunks": chunks, "extra": extra}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, cache, spec, record, chunks, seed)
    filled = sum(chunks)
    too_many = spec.max_seq_len - filled + extra
    k, v = entries(spec, too_many, seed + 7)
    for layer in range(spec.num_layers):
        err = refused(ir_adapter, lambda: cache.update(layer, k, v))  # noqa: B023
        check_lengths(ir_adapter, cache, spec, filled, params, f"after a refused write of {too_many} to layer {layer}")
        check_all_layers(ir_adapter, cache, record, params, f"after a refused write to layer {layer}")
        refusal_verdict(ir_adapter, err, f"write of {too_many} at {filled} into capacity {spec.max_seq_len}", (str(spec.max_seq_len),), params)
    if contract.advance == "explicit":
        err = refused(ir_adapter, lambda: cache.advance(too_many))
        check_lengths(ir_adapter, cache, spec, filled, params, "after a refused advance")
        check_all_layers(ir_adapter, cache, record, params, "after a refused advance")
        refusal_verdict(ir_adapter, err, f"advance({too_many}) at {filled} of capacity {spec.max_seq_len}", (str(spec.max_seq_len),), params)
    remaining = spec.max_seq_len - filled
    if remaining:
        fill(ir_adapter, cache, spec, record, [remaining], seed + 11)
        check_all_layers(ir_adapter, cache, record, params, "after filling to capacity")
    check_lengths(ir_adapter, cache, spec, spec.max_seq_len, params, "after filling to capacity")


@pytest.mark.ir_requires("cache.capacity")
@given(data=st.data())
def test_capacity_helpers_track_the_length(ir_adapter: Adapter, ir_device: str, data: st.DataObject) -> None:
    """``remaining_capacity == max_seq_len - length`` and ``is_full`` iff nothing remains, at every step.

    Guards: *overflow clamped silently* (an engine that trusts remaining_capacity to refuse work).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    cache = make(ir_adapter, spec)
    record = Record(spec)
    for n in [0, *chunks]:
        if n:
            fill(ir_adapter, cache, spec, record, [n], n)
        length = layer_length(ir_adapter.cache_contract, cache, 0)
        if cache.max_seq_len != spec.max_seq_len or cache.remaining_capacity != spec.max_seq_len - length:
            fail(
                f"max_seq_len {cache.max_seq_len}, remaining_capacity {cache.remaining_capacity} at length {length}",
                params={"spec": spec, "chunks": chunks},
            )
        if bool(cache.is_full) != (length == spec.max_seq_len):
            fail(f"is_full is {cache.is_full} at length {length} of {spec.max_seq_len}", params={"spec": spec})


@pytest.mark.ir_requires("cache.reset")
@given(data=st.data(), second=st.integers(1, 8), seed=st.integers(0, 1000))
def test_reset_restarts_at_zero(ir_adapter: Adapter, ir_device: str, data: st.DataObject, second: int, seed: int) -> None:
    """After ``reset`` the cache is empty: every length 0, and the next request's writes are all it returns.

    Guards: *cache not reset between requests*.
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    second = min(second, spec.max_seq_len)
    params = {"spec": spec, "chunks": chunks, "second": second}
    cache = make(ir_adapter, spec)
    fill(ir_adapter, cache, spec, Record(spec), chunks, seed)
    cache.reset()
    check_lengths(ir_adapter, cache, spec, 0, params, "after reset")
    record = Record(spec)
    for layer in range(spec.num_layers):
        k, v = entries(spec, second, seed + 500 + layer)
        got_k, got_v = cache.update(layer, k, v)
        if spec.window(layer) is None:
            got_k, got_v = written(ir_adapter.cache_contract, got_k, second), written(ir_adapter.cache_contract, got_v, second)
            assert_equal(got_k, k, what=f"K returned by the first update after reset (layer {layer})", params=params)
            assert_equal(got_v, v, what=f"V returned by the first update after reset (layer {layer})", params=params)
        record.k[layer].append(k)
        record.v[layer].append(v)
    commit(ir_adapter.cache_contract, cache, second)
    check_all_layers(ir_adapter, cache, record, params, "after reset and a new request")


@pytest.mark.ir_requires("cache.crop")
@given(data=st.data(), seed=st.integers(0, 1000))
def test_crop_keeps_a_prefix_and_writing_resumes_there(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """``crop(n)`` keeps positions ``[0, n)`` of every layer (speculative decoding's rollback); the
    next write lands at ``n``.

    Guards: *advance skipped or doubled* (a rollback that leaves the length or the contents behind).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    total = sum(chunks)
    keep = data.draw(st.integers(0, total), label="keep")
    params = {"spec": spec, "chunks": chunks, "keep": keep}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, cache, spec, record, chunks, seed)
    cache.crop(keep)
    for layer in range(spec.num_layers):
        ek, ev = record.expected(layer)
        record.k[layer], record.v[layer] = [ek[:, :, :keep]], [ev[:, :, :keep]]
    check_lengths(ir_adapter, cache, spec, keep, params, f"after crop({keep})")
    room = spec.max_seq_len - keep
    if room:
        fill(ir_adapter, cache, spec, record, [min(2, room)], seed + 3)
    check_all_layers(ir_adapter, cache, record, params, f"after crop({keep}) and a new write")


@pytest.mark.ir_requires("cache.reset", "cache.storage")
@given(data=st.data(), seed=st.integers(0, 1000))
def test_reset_zeroes_storage(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """``reset`` zeroes every tensor behind a pre-allocated cache (no stale K/V survives a request).

    Guards: *cache not reset between requests* (stale data read by an engine that slices the raw buffer).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    cache = make(ir_adapter, spec)
    fill(ir_adapter, cache, spec, Record(spec), chunks, seed)
    cache.reset()
    assert ir_adapter.cache_storage is not None
    for i, t in enumerate(ir_adapter.cache_storage(cache)):
        if bool(t.ne(0).any()):
            fail(f"storage tensor {i} has {int(t.ne(0).sum())} non-zero elements after reset", params={"spec": spec})


@pytest.mark.ir_requires("cache.memory_bytes")
@given(dims=irst.cache_dims(), capacity=st.integers(1, 64), dtype=irst.dtypes())
def test_memory_bytes_is_the_formula(ir_adapter: Adapter, ir_device: str, dims: irst.CacheDims, capacity: int, dtype: torch.dtype) -> None:
    """``memory_bytes == 2 * L * B * Hkv * S * D * itemsize`` for a pre-allocated cache.

    Guards: capacity planning that under- or over-counts (the Llama-3.2-1B and Qwen3-1.7B rows of
    an early size table were wrong).
    """
    spec = CacheSpec(dims.num_layers, dims.batch_size, dims.num_kv_heads, dims.head_dim, capacity, dtype, ir_device)
    cache = make(ir_adapter, spec)
    if cache.memory_bytes != spec.expected_memory_bytes:
        fail(f"memory_bytes {cache.memory_bytes} != 2*L*B*Hkv*S*D*itemsize = {spec.expected_memory_bytes}", params={"spec": spec})


@given(data=st.data(), seed=st.integers(0, 1000))
def test_dtype_and_device_preserved(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """Views from ``update`` and ``read_cache`` keep the cache's dtype and device (no silent upcast
    or host copy), and values round-trip bit for bit in every dtype."""
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    cache = make(ir_adapter, spec)
    k, v = entries(spec, chunks[0], seed)
    record = Record(spec)
    for layer in range(spec.num_layers):
        for name, t in zip(("K", "V"), cache.update(layer, k, v), strict=True):
            if t.dtype != spec.dtype or t.device != torch.device(spec.device):
                fail(f"update returned {name} as {t.dtype} on {t.device}, cache is {spec.dtype} on {spec.device}", params={"spec": spec})
        record.k[layer].append(k)
        record.v[layer].append(v)
    commit(ir_adapter.cache_contract, cache, chunks[0])
    check_all_layers(ir_adapter, cache, record, {"spec": spec}, "after one write")


# -- every documented error case: refused, and nothing changed ---------------------------------------

def error_spec(device: str) -> CacheSpec:
    return CacheSpec(num_layers=2, batch_size=2, num_kv_heads=2, head_dim=4, max_seq_len=8, dtype=torch.float32, device=device)


_OK = (2, 2, 1, 4)
# name: (call(cache, bad), substrings a good message names, needs an explicit advance)
ERROR_CASES: dict[str, tuple[Any, tuple[str, ...], bool]] = {
    "advance zero": (lambda c, bad: c.advance(0), ("0",), True),
    "advance negative": (lambda c, bad: c.advance(-2), ("-2",), True),
    "advance non-integer": (lambda c, bad: c.advance(1.5), ("1.5",), True),
    "advance past capacity": (lambda c, bad: c.advance(6), ("8",), True),
    "write past capacity": (lambda c, bad: c.update(0, bad((2, 2, 6, 4)), bad((2, 2, 6, 4))), ("8",), False),
    "layer index negative": (lambda c, bad: c.update(-1, bad(_OK), bad(_OK)), ("-1",), False),
    "layer index too large": (lambda c, bad: c.update(2, bad(_OK), bad(_OK)), ("2",), False),
    "wrong batch": (lambda c, bad: c.update(0, bad((3, 2, 1, 4)), bad((3, 2, 1, 4))), ("3, 2, 1, 4",), False),
    "wrong kv heads": (lambda c, bad: c.update(0, bad((2, 1, 1, 4)), bad((2, 1, 1, 4))), ("2, 1, 1, 4",), False),
    "wrong head_dim": (lambda c, bad: c.update(0, bad((2, 2, 1, 3)), bad((2, 2, 1, 3))), ("2, 2, 1, 3",), False),
    "3-D entries": (lambda c, bad: c.update(0, bad((2, 1, 4)), bad((2, 1, 4))), ("2, 1, 4",), False),
    "empty write": (lambda c, bad: c.update(0, bad((2, 2, 0, 4)), bad((2, 2, 0, 4))), ("2, 2, 0, 4",), False),
    "k and v shapes differ": (lambda c, bad: c.update(0, bad((2, 2, 1, 4)), bad((2, 2, 2, 4))), ("2, 2, 2, 4",), False),
    "dtype mismatch": (lambda c, bad: c.update(0, bad(_OK, torch.float64), bad(_OK, torch.float64)), ("float64",), False),
    "v dtype mismatch": (lambda c, bad: c.update(0, bad(_OK), bad(_OK, torch.bfloat16)), ("bfloat16",), False),
    "device mismatch": (lambda c, bad: c.update(0, bad(_OK, device="meta"), bad(_OK, device="meta")), ("meta",), False),
}


# Cases that need a capacity to exceed; a cache without one (it grows) is not judged by them.
BOUNDED_CASES = ("advance past capacity", "write past capacity")


@pytest.mark.ir_requires("cache.errors")
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.ir_requires("cache.bounded")) if c in BOUNDED_CASES else c for c in ERROR_CASES],
)
def test_error_case_is_refused_and_changes_nothing(ir_adapter: Adapter, ir_device: str, case: str) -> None:
    """Each misuse is refused and leaves every layer's length and contents as they were. The state
    is checked first (a cache that raises *and* corrupts itself is reported as corrupting), then
    that an error of the contract's family was raised; message wording is reported, not required.
    An empty write may instead be a no-op where the contract says so.

    Guards: *overflow clamped silently*, negative layer indices aliasing the last layer, and
    half-applied writes (state changed before the error).
    """
    call, needles, needs_advance = ERROR_CASES[case]
    contract = ir_adapter.cache_contract
    if needs_advance and contract.advance != "explicit":
        pytest.skip(f"not supported by {ir_adapter.name} (its cache has no advance: lengths move inside update)")
    spec = error_spec(ir_device)

    def bad(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, device: str = ir_device) -> Tensor:
        return torch.ones(shape, dtype=dtype, device=device)

    cache = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, cache, spec, record, [3], seed=5)
    err = refused(ir_adapter, lambda: call(cache, bad))
    params = {"case": case}
    check_lengths(ir_adapter, cache, spec, 3, params, f"after the refused call ({case})")
    check_all_layers(ir_adapter, cache, record, params, f"after the refused call ({case})")
    if case == "empty write" and contract.empty_write == "ignored" and err is None:
        return
    refusal_verdict(ir_adapter, err, case, needles, params)
