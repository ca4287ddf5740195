"""Snapshot / restore / materialize, for any implementation whose caches take snapshots.

The oracle is the record of what was written (as in ``test_cache.py``): a snapshot must hold
exactly the positions written before it was taken, whatever happens to its source afterwards.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance.assertions import fail
from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import layer_length
from infer_ref.conformance.tests.test_cache import Record, cache_cases, check_all_layers, fill, make

pytestmark = pytest.mark.ir_requires("snapshot")


def _copy(record: Record) -> Record:
    out = Record(record.spec)
    out.k = [list(layer) for layer in record.k]
    out.v = [list(layer) for layer in record.v]
    return out


@given(data=st.data(), more=st.integers(1, 4), seed=st.integers(0, 1000))
def test_snapshot_is_frozen_and_restores_anywhere(ir_adapter: Adapter, ir_device: str, data: st.DataObject, more: int, seed: int) -> None:
    """Write, snapshot, keep writing (and reset) the source; the snapshot restores into a fresh cache
    and materializes into a new one holding exactly what was written before it, and both take the
    next write at the right position.

    Guards: *snapshot aliases the live buffers* (a shallow copy), restore that leaves the old
    length or contents behind.
    """
    assert ir_adapter.snapshot and ir_adapter.restore and ir_adapter.materialize
    spec, chunks = data.draw(cache_cases(ir_device), label="case")
    spec = CacheSpec(spec.num_layers, spec.batch_size, spec.num_kv_heads, spec.head_dim, spec.max_seq_len + more, spec.dtype, spec.device)
    params = {"spec": spec, "chunks": chunks, "more": more}
    source = make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, source, spec, record, chunks, seed)
    snap = ir_adapter.snapshot(source)
    at_snapshot = _copy(record)
    fill(ir_adapter, source, spec, record, [more], seed + 1)  # the source moves on, in place
    if hasattr(source, "reset"):
        source.reset()
        fill(ir_adapter, source, spec, Record(spec), [sum(chunks)], seed + 2)

    fresh = make(ir_adapter, spec)
    fill(ir_adapter, fresh, spec, Record(spec), [1], seed + 3)  # something to be replaced
    ir_adapter.restore(fresh, snap)
    materialized = ir_adapter.materialize(snap)
    for label, cache in (("restored", fresh), ("materialized", materialized)):
        length = layer_length(ir_adapter.cache_contract, cache, 0)
        if length != sum(chunks):
            fail(f"{label} cache holds {length} positions, the snapshot {sum(chunks)}", params=params)
        check_all_layers(ir_adapter, cache, at_snapshot, params, f"in the {label} cache")
        nxt = _copy(at_snapshot)
        fill(ir_adapter, cache, spec, nxt, [more], seed + 4)
        check_all_layers(ir_adapter, cache, nxt, params, f"after writing to the {label} cache")
    # Writing to the restored copies must not reach the snapshot either.
    again = make(ir_adapter, spec)
    ir_adapter.restore(again, snap)
    check_all_layers(ir_adapter, again, at_snapshot, params, "in a second restore of the same snapshot")


@pytest.mark.ir_requires("cache.storage")
def test_restore_copies_into_the_existing_storage(ir_adapter: Adapter, ir_device: str) -> None:
    """A pre-allocated cache restores in place: its storage tensors keep their addresses (a captured
    CUDA graph that reads them stays valid).

    Guards: *restore rebinds the buffers (a captured graph reads stale memory)*: new tensors
    instead of a copy into the existing ones; and *restored cache shares the snapshot's storage*,
    since a restore that adopts the snapshot's tensors leaves the existing ones too.
    """
    assert ir_adapter.snapshot and ir_adapter.restore and ir_adapter.cache_storage
    spec = CacheSpec(num_layers=2, batch_size=1, num_kv_heads=2, head_dim=4, max_seq_len=8, device=ir_device)
    source, target = make(ir_adapter, spec), make(ir_adapter, spec)
    record = Record(spec)
    fill(ir_adapter, source, spec, record, [3, 2], seed=1)
    fill(ir_adapter, target, spec, Record(spec), [1], seed=2)
    before = [t.data_ptr() for t in ir_adapter.cache_storage(target)]
    ir_adapter.restore(target, ir_adapter.snapshot(source))
    after = [t.data_ptr() for t in ir_adapter.cache_storage(target)]
    if before != after:
        fail(f"restore moved the cache's storage: data_ptr {before} -> {after}")
    check_all_layers(ir_adapter, target, record, {}, "after an in-place restore")


@pytest.mark.ir_requires("cache.bounded")
def test_a_snapshot_too_long_for_the_target_is_refused(ir_adapter: Adapter, ir_device: str) -> None:
    """Restoring more positions than the target holds raises and leaves the target unchanged."""
    assert ir_adapter.snapshot and ir_adapter.restore
    big = CacheSpec(num_layers=2, batch_size=1, num_kv_heads=1, head_dim=4, max_seq_len=10, device=ir_device)
    small = CacheSpec(num_layers=2, batch_size=1, num_kv_heads=1, head_dim=4, max_seq_len=6, device=ir_device)
    source, target = make(ir_adapter, big), make(ir_adapter, small)
    fill(ir_adapter, source, big, Record(big), [9], seed=1)
    record = Record(small)
    fill(ir_adapter, target, small, record, [2], seed=2)
    with pytest.raises(ir_adapter.cache_contract.error_types):
        ir_adapter.restore(target, ir_adapter.snapshot(source))
    if layer_length(ir_adapter.cache_contract, target, 0) != 2:
        fail(f"a refused restore moved the length from 2 to {layer_length(ir_adapter.cache_contract, target, 0)}")
    check_all_layers(ir_adapter, target, record, {}, "after a refused restore")


