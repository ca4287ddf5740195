"""Cache store: write K/V rows into a cache through a slot mapping (seed 002's ``store_kvcache``).

A cache here is any 4-D tensor ``[outer, inner, Hkv, D]`` with arbitrary strides; slot ``s`` is row
``(s // inner, s % inner)``. Two layouts use it:

- the paged pool of one layer, ``[num_blocks, block_size, Hkv, D]``: slot
  ``block_table[pos // bs] * bs + pos % bs``;
- the contiguous cache of one layer, ``[B, Hkv, S, D]`` seen as ``[B, S, Hkv, D]`` (a permuted view,
  no copy): slot ``b * S + pos`` (seed 004's update at position + count).

A slot of ``-1`` writes nothing (a prefix-cache hit, a padding row). It must never be used as an
index: Python and torch read ``-1`` as "the last slot", which silently overwrites a live entry.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_store_args(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Shapes, dtypes and devices (host metadata only: no device synchronisation)."""
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [num_tokens, num_kv_heads, head_dim], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [outer, inner, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"entries are [*, {k.shape[1]}, {k.shape[2]}] but the cache holds [*, *, {k_cache.shape[2]}, {k_cache.shape[3]}]")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [num_tokens={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != k.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, k has {k.dtype}: the store never converts")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("slot_mapping", slot_mapping)):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device}, k is on {k.device}")
    if k_cache.data_ptr() == v_cache.data_ptr():
        raise ValueError("k_cache and v_cache are the same storage: V would overwrite K")


def store_kvcache_reference(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write ``k[i]``/``v[i]`` ``[Hkv, D]`` at slot ``slot_mapping[i]``; ``-1`` writes nothing.

    Args:
        k, v: ``[N, Hkv, D]`` rows to store.
        k_cache, v_cache: ``[outer, inner, Hkv, D]``, written in place (views write through).
        slot_mapping: ``[N]`` integer slots in ``[0, outer * inner)`` or ``-1``; distinct.
    """
    check_store_args(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.long()
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    bad = (slots < -1) | (slots >= num_slots)
    if bool(bad.any()):
        raise IndexError(
            f"slot_mapping holds {slots[bad].tolist()[:8]}: slots must be in [0, {num_slots}) or -1 (skip)"
        )
    keep = slots >= 0  # -1 is "skip", never an index
    live = slots[keep]
    if live.numel() != live.unique().numel():
        raise ValueError("slot_mapping writes one slot twice: the result would depend on write order")
    inner = k_cache.shape[1]
    outer_idx, inner_idx = live // inner, live % inner
    k_cache[outer_idx, inner_idx] = k[keep]  # index_put_ through the (possibly strided) view
    v_cache[outer_idx, inner_idx] = v[keep]


def store_kvcache(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """:func:`store_kvcache_reference`'s contract (the dispatching entry point the caches call)."""
    store_kvcache_reference(k, v, k_cache, v_cache, slot_mapping)
