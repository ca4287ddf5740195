"""Slot arithmetic and slot-addressed copies: how the slot caches find and move rows, in torch.

A layer's storage is seen as ``[outer, inner, Hkv, D]`` (a paged pool ``[num_blocks, block_size,
Hkv, D]``, or a contiguous layer as ``[B*Hkv, S, 1, D]``); slot ``s`` is row ``(s // inner, s % inner)``.
A cache computes the slots of a write or a read here and copies through them with :func:`store_rows`
unless its caller hands it another store with the same contract (the fast path hands it
:func:`infer_ref.fast.kernels.store.store_kvcache`, which writes in place also inside ``torch.compile``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

# store(k_rows, v_rows, k_dest, v_dest, slots): write row i of k_rows/v_rows [N, ...] at slot slots[i]
# of k_dest/v_dest [outer, inner, ...], in place.
StoreFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]


def slots_through_tables(block_tables: Tensor, positions: Tensor, block_size: int) -> Tensor:
    """Slots ``block_tables[b, p // bs] * bs + p % bs`` of positions ``[B, N]`` (int64, same shape).

    Positions past a row's blocks read its last table entry (clamped): callers mask them.
    """
    width = block_tables.shape[1]
    blocks = block_tables.long().gather(1, (positions // block_size).clamp(max=width - 1))  # [B, N]
    return blocks * block_size + positions % block_size


def gather_slots(cache: Tensor, slots: Tensor) -> Tensor:
    """Rows ``slots`` ``[B, S]`` of one layer's pool ``[num_blocks, bs, Hkv, D]`` -> ``[B, Hkv, S, D]``."""
    num_blocks, block_size, hkv, d = cache.shape
    flat = cache.reshape(num_blocks * block_size, hkv, d)  # a view for a contiguous pool
    return flat[slots].transpose(1, 2)  # [B, S, Hkv, D] -> [B, Hkv, S, D]


def store_rows(k: Tensor, v: Tensor, k_dest: Tensor, v_dest: Tensor, slots: Tensor) -> None:
    """Write ``k[i]``/``v[i]`` at slot ``slots[i]`` of ``k_dest``/``v_dest`` ``[outer, inner, ...]``, in place.

    The caches' own slots are always in range and distinct (computed from their tables or
    positions), so this is a plain indexed copy; ``k_dest`` must be viewable as ``[outer*inner, ...]``.
    """
    k_dest.view(-1, *k_dest.shape[2:]).index_copy_(0, slots, k)  # [outer*inner, ...]
    v_dest.view(-1, *v_dest.shape[2:]).index_copy_(0, slots, v)


__all__ = ["StoreFn", "gather_slots", "slots_through_tables", "store_rows"]
