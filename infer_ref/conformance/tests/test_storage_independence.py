"""Storage independence: a cache owns its K/V, for any cache an adapter can make.

What the kit promises, and judges here:

* ``update(layer, k, v)`` **copies** ``k`` and ``v``: once it returns, the caller may overwrite or
  reuse its tensors (a model reuses its projection buffers) and the cache is unchanged.
* What ``update`` and ``read_cache`` return is the cache's to *lend*: the caller reads it and never
  writes into it (infer_ref's are views of its storage, so a write would change the cache). The
  kit does not judge writes into them; a cache need not defend against them.
* A **snapshot** shares no storage with any cache, in either direction: writes to the cache it was
  taken from, to a cache it was restored into, or to a cache it was materialized as never change
  it, and writes to any of those caches never change another.

"Writes" are every mutating member the cache has: an appending ``update``, ``crop`` then a rewrite
of the cropped positions, ``reset`` then a new request. Expected contents are clones of what was
written, taken before anything is mutated (the oracle is the list of writes, as in ``test_cache.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import commit
from infer_ref.conformance.tests.test_cache import Record, check_all_layers, draw_case, entries, fill, make

pytestmark = pytest.mark.ir_requires("cache")

MORE = 3  # room past the drawn chunks for the writes that must not reach anyone else


def frozen(record: Record) -> Record:
    """A copy of ``record`` holding clones: the expected contents, whatever happens to the originals."""
    out = Record(record.spec)
    out.k = [[t.clone() for t in layer] for layer in record.k]
    out.v = [[t.clone() for t in layer] for layer in record.v]
    return out


def roomy(spec: CacheSpec) -> CacheSpec:
    """``spec`` with ``MORE`` positions of room for later writes."""
    return CacheSpec(spec.num_layers, spec.batch_size, spec.num_kv_heads, spec.head_dim, spec.max_seq_len + MORE,
                     spec.dtype, spec.device, spec.layer_windows)  # fmt: skip


def scribble(adapter: Adapter, cache: Any, spec: CacheSpec, held: int, seed: int) -> None:
    """Write through every mutating member ``cache`` has: append, crop and rewrite, reset and refill."""
    fill(adapter, cache, spec, Record(spec), [MORE], seed)
    if hasattr(cache, "crop"):
        cache.crop(held // 2)  # rewrite positions the snapshot holds, where an alias would show
        fill(adapter, cache, spec, Record(spec), [held - held // 2 + MORE], seed + 1)
    if hasattr(cache, "reset"):
        cache.reset()  # a pre-allocated cache zeroes its storage in place
        fill(adapter, cache, spec, Record(spec), [held], seed + 2)


@given(data=st.data(), seed=st.integers(0, 1000))
def test_caller_overwriting_its_tensors_leaves_the_cache_unchanged(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """After each ``update``, the caller overwrites the ``k``/``v`` it passed, in place; every layer
    still holds the clones taken before the overwrite, after every chunk.

    Guards: *cache storage shared with the caller* (a cache that keeps the caller's tensor, or a
    view of it, instead of copying).
    """
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    cache = make(ir_adapter, spec)
    record = Record(spec)
    for c, n in enumerate(chunks):
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            record.k[layer].append(k.clone())
            record.v[layer].append(v.clone())
            cache.update(layer, k, v)
            k.fill_(7.0)  # the caller reuses its buffers for the next forward
            v.fill_(-7.0)
        commit(ir_adapter.cache_contract, cache, n)
        check_all_layers(ir_adapter, cache, record, params, f"after chunk {c} and the caller overwrote its k/v")


@pytest.mark.ir_requires("snapshot")
@given(data=st.data(), seed=st.integers(0, 1000))
def test_writes_after_a_snapshot_never_reach_it(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """Snapshot, then write through every mutating member of the source (append, crop and rewrite,
    reset and refill); the snapshot, materialized and restored, holds the clones taken before.

    Guards: *snapshot aliases the live buffers*.
    """
    assert ir_adapter.snapshot and ir_adapter.restore and ir_adapter.materialize
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    spec = roomy(spec)
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    source = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, source, spec, record, chunks, seed)
    expected = frozen(record)
    snap = ir_adapter.snapshot(source)
    scribble(ir_adapter, source, spec, sum(chunks), seed + 1)
    check_all_layers(ir_adapter, ir_adapter.materialize(snap), expected, params, "in the snapshot (materialized) after the source was rewritten")
    target = make(ir_adapter, spec)
    ir_adapter.restore(target, snap)
    check_all_layers(ir_adapter, target, expected, params, "in the snapshot (restored) after the source was rewritten")


@pytest.mark.ir_requires("snapshot")
@given(data=st.data(), seed=st.integers(0, 1000))
def test_a_restored_or_materialized_cache_shares_nothing(ir_adapter: Adapter, ir_device: str, data: st.DataObject, seed: int) -> None:
    """Restore a snapshot into a cache and rewrite that cache (append, crop and rewrite, reset and
    refill); then materialize the same snapshot and rewrite that one too. After each, the snapshot
    (materialized afresh) and the source it was taken from still hold the clones taken before, and
    the first restored cache is not changed by the materialized one's writes.

    Guards: *restored cache shares the snapshot's storage* (a zero-copy restore or materialize).
    """
    assert ir_adapter.snapshot and ir_adapter.restore and ir_adapter.materialize
    spec, chunks = draw_case(data, ir_adapter, ir_device)
    spec = roomy(spec)
    held = sum(chunks)
    params = {"spec": spec, "chunks": chunks, "seed": seed}
    source = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, source, spec, record, chunks, seed)
    expected = frozen(record)
    snap = ir_adapter.snapshot(source)

    restored = make(ir_adapter, spec)
    ir_adapter.restore(restored, snap)
    scribble(ir_adapter, restored, spec, held, seed + 1)
    check_all_layers(ir_adapter, ir_adapter.materialize(snap), expected, params, "in the snapshot after a cache restored from it was rewritten")
    check_all_layers(ir_adapter, source, expected, params, "in the source after a cache restored from its snapshot was rewritten")

    again = make(ir_adapter, spec)
    ir_adapter.restore(again, snap)  # a second cache restored from the snapshot, left alone
    materialized = ir_adapter.materialize(snap)
    scribble(ir_adapter, materialized, spec, held, seed + 2)
    check_all_layers(ir_adapter, ir_adapter.materialize(snap), expected, params, "in the snapshot after a cache materialized from it was rewritten")
    check_all_layers(ir_adapter, source, expected, params, "in the source after a cache materialized from its snapshot was rewritten")
    check_all_layers(ir_adapter, again, expected, params, "in a second restored cache after a materialized one was rewritten")


def test_the_overwrite_is_seen(ir_adapter: Adapter, ir_device: str) -> None:
    """Negative control: the caller's overwrite really changes its tensors (so a cache keeping them
    would read back different values): the check above can fail."""
    spec = CacheSpec(num_layers=1, batch_size=1, num_kv_heads=1, head_dim=4, max_seq_len=4, dtype=torch.float64, device=ir_device)
    k, _ = entries(spec, 2, seed=1)
    before = k.clone()
    k.fill_(7.0)
    assert not torch.equal(k, before), "entries() drew a tensor of sevens: the overwrite would be invisible"
