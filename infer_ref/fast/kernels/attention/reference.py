"""The definitions the decode attention kernel must equal, and the reads of a paged cache.

A layer's pool is ``[num_blocks, block_size, Hkv, D]``; row ``b`` of a batch owns the blocks
``block_tables[b, :ceil(len_b / bs)]``, position ``p`` living at block ``block_tables[b, p // bs]``,
offset ``p % bs``. Entries of a table past ``ceil(len_b / bs)`` are never read, whatever they hold
(stale ids, ``-1``): a reader that looks at them is wrong.

:func:`gather_paged_kv` is the reference read (copy the prefix out, contiguous); it is also what
``PagedKVCache.update`` returns on the general path. :func:`paged_decode_attention_reference`
attends one query row per sequence over the gathered prefix. :func:`decode_attention_reference` is
one decode step of one layer from the projected q/k/v, written with the torch definitions the
models use: ``q, k = q_norm(q), k_norm(k)`` per head when given (``infer_ref.norm``); ``q, k``
rotated by ``apply_rope`` (``infer_ref.rotary``) with the new token's cos/sin rows; ``k``
(normed and rotated) and ``v`` (raw: V is never normed or rotated) written into the layer's pool
at position ``seq_lens[b] - 1`` of row ``b``, slot ``table[b, p // bs] * bs + p % bs``; then
:func:`paged_decode_attention_reference` of the rotated query over positions ``[0, seq_lens[b])``
(a sliding layer: its window).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.cache.slots import gather_slots, slots_through_tables
from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.attention.checks import AttentionCall
from infer_ref.fast.kernels.store.reference import store_kvcache_reference
from infer_ref.rotary import apply_rope


def gather_paged_kv(cache: Tensor, block_tables: Tensor, length: int) -> Tensor:
    """The first ``length`` positions of every row, contiguous: ``[B, Hkv, length, D]``.

    Args:
        cache: one layer's pool ``[num_blocks, block_size, Hkv, D]``.
        block_tables: ``[B, M]`` integer block ids, ``M >= ceil(length / block_size)``.
        length: positions to read (the same for every row).
    """
    block_size = cache.shape[1]
    needed = -(-length // block_size)
    if block_tables.dim() != 2 or block_tables.shape[1] < needed:
        raise ValueError(f"block_tables must be [B, M>={needed}] for {length} positions, got {tuple(block_tables.shape)}")
    positions = torch.arange(length, device=block_tables.device).expand(block_tables.shape[0], -1)  # [B, S]
    return gather_slots(cache, slots_through_tables(block_tables, positions, block_size))


@takes_arguments_of(AttentionCall.paged)
def paged_decode_attention_reference(call: AttentionCall) -> Tensor:
    """One query row per sequence over its paged prefix, in float32 (float64 for float64 inputs): ``[B, H, D]``.

    Args:
        q: ``[B, H, D]``, the query at position ``seq_lens[b] - 1`` (its own K/V already stored).
        k_cache, v_cache: one layer's pool ``[num_blocks, block_size, Hkv, D]``.
        block_tables: ``[B, M]`` block ids.
        seq_lens: ``[B]`` positions held per row, including the query's own.
        scale: softmax scale.
        window: sliding window (keys at distance ``< window`` visible) or None.

    Query head ``h`` reads KV head ``h // (H / Hkv)``.
    """
    q, k_cache, v_cache, block_tables, seq_lens = call.q, call.k_cache, call.v_cache, call.block_tables, call.seq_lens
    scale, window = call.scale, call.window
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty_like(q)
    acc = torch.promote_types(q.dtype, torch.float32)  # never below float32
    for row in range(b):
        n = int(seq_lens[row])
        k = gather_paged_kv(k_cache, block_tables[row : row + 1], n)[0].to(acc)  # [Hkv, n, D]
        v = gather_paged_kv(v_cache, block_tables[row : row + 1], n)[0].to(acc)
        first = 0 if window is None else max(0, n - window)
        k, v = k[:, first:], v[:, first:]
        qg = q[row].to(acc).view(hkv, h // hkv, d)  # [Hkv, G, D]
        scores = torch.einsum("kgd,ksd->kgs", qg, k) * scale  # [Hkv, G, S]
        out[row] = torch.einsum("kgs,ksd->kgd", F.softmax(scores, dim=-1), v).reshape(h, d).to(q.dtype)
    return out


def _check_values(k_cache: Tensor, block_tables: Tensor, seq_lens: Tensor) -> None:
    """The reference's value checks (it may synchronise): lengths in ``[1, M * bs]`` and every table
    entry it reads (``c < ceil(n / bs)``) a block of the pool, before anything is written."""
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    capacity = block_tables.shape[1] * block_size
    lens = seq_lens.long().cpu()
    bad = (lens < 1) | (lens > capacity)
    if bool(bad.any()):
        raise ValueError(
            f"seq_lens holds {lens[bad].tolist()[:8]}: each must be in [1, {capacity}] (the new token's position + 1, "
            f"within block_tables' {block_tables.shape[1]} blocks of {block_size})"
        )
    tables = block_tables.long().cpu()
    for row, n in enumerate(lens.tolist()):
        used = tables[row, : -(-n // block_size)]
        wrong = (used < 0) | (used >= num_blocks)
        if bool(wrong.any()):
            raise IndexError(f"block_tables[{row}] holds {used[wrong].tolist()[:8]} among its first {used.numel()} entries: block ids must be in [0, {num_blocks})")


@takes_arguments_of(AttentionCall)
def decode_attention_reference(call: AttentionCall) -> Tensor:
    """One decode step of one layer, by the torch definitions: ``[B, H, D]`` in q's dtype.

    Args:
        q: ``[B, H, D]``, the new token's query before the per-head norm and RoPE (any strides).
        k, v: ``[B, Hkv, D]``, its key (before k_norm and RoPE) and value (stored as is).
        cos, sin: ``[B, D]`` (per row) or ``[1, D]`` (shared): the RoPE tables of the new token's
            position, in the activation dtype; both None: no RoPE.
        k_cache, v_cache: one layer's pool ``[num_blocks, block_size, Hkv, D]`` (possibly a strided
            view, :func:`~infer_ref.fast.kernels.attention.layout.contiguous_layer_as_paged`); the new
            K/V are written in place at position ``seq_lens[b] - 1`` through the block table.
        block_tables: ``[B, M]`` int32/int64 block ids.
        seq_lens: ``[B]`` int32/int64, the length of each row after this token (``>= 1``).
        scale: softmax scale.
        window: sliding window (key ``j`` visible to the query at ``p`` iff ``p - window < j <= p``)
            or None.
        q_norm, k_norm: per-head RMSNorms (weight ``[D]``) applied before RoPE, or None.

    Query head ``h`` reads KV head ``h // (H / Hkv)``. Values are checked (this synchronises).
    """
    call.check()
    q, k, v = call.q, cast(Tensor, call.k), cast(Tensor, call.v)  # tensors: checked
    cos, sin, q_norm, k_norm = call.cos, call.sin, call.q_norm, call.k_norm
    k_cache, v_cache, block_tables, seq_lens = call.k_cache, call.v_cache, call.block_tables, call.seq_lens
    _check_values(k_cache, block_tables, seq_lens)
    q4, k4 = q[:, :, None], k[:, :, None]  # [B, H, 1, D], [B, Hkv, 1, D]: one token
    if q_norm is not None:
        q4 = q_norm(q4)
    if k_norm is not None:
        k4 = k_norm(k4)
    if cos is not None and sin is not None:
        # [1, D] is apply_rope's [T=1, D] (shared by every row); [B, D] becomes [B, T=1, D] (per row).
        c, s = (cos, sin) if cos.shape[0] == 1 else (cos[:, None], sin[:, None])
        q4, k4 = apply_rope(q4, c, s), apply_rope(k4, c, s)
    slots = slots_through_tables(block_tables, (seq_lens.long() - 1)[:, None], k_cache.shape[1]).reshape(-1)  # [B]
    store_kvcache_reference(k4[:, :, 0], v, k_cache, v_cache, slots)
    return paged_decode_attention_reference(q4[:, :, 0], k_cache, v_cache, block_tables, seq_lens, call.scale, call.window)


__all__ = [
    "decode_attention_reference",
    "gather_paged_kv",
    "gather_slots",
    "paged_decode_attention_reference",
    "slots_through_tables",
]
