"""The definition of the KV store and the host checks every store runs (the package docstring)."""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.fast.kernels.common import overlap


def check_store_args(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Shapes, dtypes, devices and aliasing (host metadata only: no device synchronisation)."""
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
    # Addresses are not traceable: under torch.compile the check is left to eager calls (caches check
    # their buffers when they are built; a traced step only ever stores into those).
    if not torch.compiler.is_compiling() and overlap(k_cache, v_cache):
        raise ValueError("k_cache and v_cache share memory: a V write would overwrite K (or the reverse)")


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


__all__ = ["check_store_args", "store_kvcache_reference"]
