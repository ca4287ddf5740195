"""Reading a paged cache through its block tables.

A layer's pool is ``[num_blocks, block_size, Hkv, D]``; row ``b`` of a batch owns the blocks
``block_tables[b, :ceil(len_b / bs)]``, position ``p`` living at block ``block_tables[b, p // bs]``,
offset ``p % bs``. Entries of a table past ``ceil(len_b / bs)`` are never read, whatever they hold
(stale ids, ``-1``): a reader that looks at them is wrong.

:func:`gather_paged_kv` is the reference read (copy the prefix out, contiguous); it is also what
``PagedKVCache.update`` returns on the general path. :func:`paged_decode_attention_reference`
attends one query row per sequence over the gathered prefix; a kernel reading K/V through the table
without gathering must equal it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def paged_slots(block_table: Tensor, length: int, block_size: int) -> Tensor:
    """Flat slots ``[length]`` (int64) of positions ``0 .. length-1`` for one table ``[M]``."""
    pos = torch.arange(length, device=block_table.device)
    return block_table[pos // block_size].long() * block_size + pos % block_size


def gather_paged_kv(cache: Tensor, block_tables: Tensor, length: int) -> Tensor:
    """The first ``length`` positions of every row, contiguous: ``[B, Hkv, length, D]``.

    Args:
        cache: one layer's pool ``[num_blocks, block_size, Hkv, D]``.
        block_tables: ``[B, M]`` integer block ids, ``M >= ceil(length / block_size)``.
        length: positions to read (the same for every row).
    """
    num_blocks, block_size, hkv, d = cache.shape
    needed = -(-length // block_size)
    if block_tables.dim() != 2 or block_tables.shape[1] < needed:
        raise ValueError(f"block_tables must be [B, M>={needed}] for {length} positions, got {tuple(block_tables.shape)}")
    flat = cache.reshape(num_blocks * block_size, hkv, d)  # a view for a contiguous pool
    rows = [flat[paged_slots(table, length, block_size)] for table in block_tables]  # [S, Hkv, D] each
    return torch.stack(rows).transpose(1, 2)  # [B, Hkv, S, D]


def paged_decode_attention_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
) -> Tensor:
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


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
) -> Tensor:
    """:func:`paged_decode_attention_reference`'s contract (the dispatching entry point)."""
    return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale, window)


__all__ = ["gather_paged_kv", "paged_decode_attention", "paged_decode_attention_reference", "paged_slots"]
