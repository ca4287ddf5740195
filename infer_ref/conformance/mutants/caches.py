"""Planted bugs of the cache systems (stores, paged reads, block tables, snapshots), as shipped in
real engines. Each is a piece of infer_ref with one line changed; ``infer_ref.conformance.mutants``
registers them beside the model-level mutants.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.dynamic import DynamicKVCache
from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.conformance.adapters import reference as ref
from infer_ref.conformance.interface.adapter import CacheSpec
from infer_ref.fast.kernels.attention import paged_decode_attention_reference
from infer_ref.fast.kernels.store import check_store_args

# The cache-system bug classes (slot mapping, paged reads, snapshots), in the words of the incidents.
CACHE_BUG_CLASSES = (
    "slot -1 used as an index (wraps to the last slot)",
    "paged read past the sequence's last written slot",
    "decode slot off by one in the block table",
    "snapshot aliases the live buffers",
    "restore rebinds the buffers (a captured graph reads stale memory)",
    "cache storage shared with the caller",
    "restored cache shares the snapshot's storage",
)


def store_minus_one_wraps(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """The store without the ``-1`` check: ``-1 // inner``, ``-1 % inner`` is the very last slot."""
    check_store_args(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.long()
    inner = k_cache.shape[1]
    k_cache[slots // inner, slots % inner] = k
    v_cache[slots // inner, slots % inner] = v


def paged_decode_reads_whole_last_block(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, window: int | None = None
) -> Tensor:
    """A decode read that attends every slot of the last block (``ceil(len/bs) * bs`` keys), filled or not."""
    bs = k_cache.shape[1]
    rounded = ((seq_lens.long() + bs - 1) // bs) * bs
    return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, rounded.to(seq_lens.dtype), scale, window)


class DecodeSlotOffByOnePagedCache(PagedKVCache):
    """A single-token step writes at the slot of position ``len - 1`` instead of ``len`` (the decode
    slot computed from the length *before* the append; nano-vllm shipped this for weeks): each decode
    token overwrites its predecessor and leaves its own slot unwritten."""

    def _plan_for(self, t: int) -> Any:
        plan = super()._plan_for(t)
        if t != 1:
            return plan
        late = [self.slot_mapping([max(0, n - 1)], row)[0] for row, n in enumerate(plan.lengths)]
        return dataclasses.replace(plan, write_slots=torch.tensor(late, dtype=torch.long, device=self.device))


def paged_off_by_one_cache(spec: CacheSpec) -> PagedKVCache:
    cache = ref.cache_adapter("paged", block_size=ref.PAGED_BLOCK_SIZE, scramble_seed=ref.PAGED_SCRAMBLE_SEED)
    assert cache.make_cache is not None
    real = cache.make_cache(spec)
    return DecodeSlotOffByOnePagedCache(real.pool, batch_size=spec.batch_size, max_seq_len=spec.max_seq_len)


class ShallowSnapshotCache(KVCache):
    """``snapshot`` keeps views of the live buffers instead of copies: later writes show through."""

    def snapshot(self) -> KVSnapshot:
        n = self.seq_len
        return KVSnapshot(self.k[:, :, :, :n], self.v[:, :, :, :n], type(self), self._snapshot_settings())


class RebindingRestoreCache(KVCache):
    """``restore`` builds new tensors and rebinds ``k``/``v`` instead of copying into them: right
    contents, but a captured CUDA graph (or anyone holding the old tensors) keeps reading the old memory."""

    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        n = keys.shape[3]
        fresh_k, fresh_v = torch.zeros_like(self.k), torch.zeros_like(self.v)
        fresh_k[:, :, :, :n] = keys
        fresh_v[:, :, :, :n] = values
        self.k, self.v = fresh_k, fresh_v
        self._set_length(n)


class CallerTensorDynamicCache(DynamicKVCache):
    """The first write to an empty layer keeps the caller's ``k``/``v`` tensors themselves ("nothing
    to concatenate yet", as transformers' ``DynamicCache`` appends them): a caller that reuses its
    projection buffers rewrites the cache."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.seq_len > 0:
            return super().update(layer_idx, k, v)
        self._check_write(layer_idx, k, v)
        self._k[layer_idx], self._v[layer_idx] = k, v  # the caller's memory, not a copy
        return k, v


def caller_tensor_cache(spec: CacheSpec) -> DynamicKVCache:
    return CallerTensorDynamicCache(
        spec.num_layers, spec.num_kv_heads, spec.head_dim, batch_size=spec.batch_size, dtype=spec.dtype, device=spec.device
    )


class BufferSnapshot:
    """A snapshot that owns a copy of the whole pre-allocated buffers and the length (right), and
    hands those very tensors to whoever restores or materializes it (the bug)."""

    def __init__(self, k: Tensor, v: Tensor, seq_len: int) -> None:
        self.k, self.v, self.seq_len = k, v, seq_len

    def materialize(self) -> KVCache:
        return AdoptingRestoreCache(self.k, self.v, self.seq_len)


class AdoptingRestoreCache(KVCache):
    """``restore`` (and ``materialize``) adopt the snapshot's tensors instead of copying out of them
    ("zero-copy restore"): every later write to the restored cache (a crop and rewrite, a reset)
    lands in the snapshot, and two caches restored from one snapshot share storage."""

    def snapshot(self) -> BufferSnapshot:  # type: ignore[override]
        return BufferSnapshot(self.k.clone(), self.v.clone(), self.seq_len)

    def restore(self, snapshot: BufferSnapshot) -> None:  # type: ignore[override]
        if snapshot.k.shape != self.k.shape or snapshot.k.dtype != self.k.dtype:
            raise ValueError(f"snapshot buffers {tuple(snapshot.k.shape)} do not match this cache's {tuple(self.k.shape)}")
        self.k, self.v = snapshot.k, snapshot.v
        self._set_length(snapshot.seq_len)
