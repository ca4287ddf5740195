"""A contiguous cache layer read as a paged pool, in place: the one decode attention kernel reads
a static cache's layer ``[B, Hkv, S, D]`` through identity block tables (every stride is a kernel
parameter).
"""

from __future__ import annotations

import torch
from torch import Tensor


def contiguous_layer_as_paged(layer: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """A contiguous cache layer ``[B, Hkv, S, D]`` as a paged pool and its identity block tables.

    Returns ``(pool, block_tables)``: ``pool`` is a strided *view* of ``layer`` (no copy) shaped
    ``[num_blocks, block_size, Hkv, D]`` with strides ``(bs*D, D, S*D, 1)`` (in elements), and
    ``block_tables[b, c] = b * (Hkv * S / bs) + c`` for ``c < S / bs``. Checking the arithmetic:
    block ``b*(Hkv*S/bs) + c``, offset ``o``, head ``h``, dim ``e`` lands at
    ``(b*(Hkv*S/bs) + c)*bs*D + o*D + h*S*D + e = b*Hkv*S*D + h*S*D + (c*bs + o)*D + e``, which is
    exactly ``layer[b, h, c*bs + o, e]``. Blocks overlap in memory (block ``k`` of one row and head
    is also part of other heads' rows); only the identity ids are ever read. ``num_blocks`` is
    ``(B-1)*Hkv*S/bs + S/bs``: the last row's head-0 blocks are the highest ids, and their head
    ``Hkv-1`` entries end at the layer's last element, so the view stays inside the storage.

    Args:
        layer: ``[B, Hkv, S, D]`` with a contiguous last dimension and ``S`` a multiple of
            ``block_size`` (a static cache layer, or ``KVCache.k[layer]``).
        block_size: positions per block; ``S`` itself gives one block per row.
    """
    if layer.dim() != 4:
        raise ValueError(f"layer must be [batch, num_kv_heads, max_seq_len, head_dim], got {tuple(layer.shape)}")
    b, hkv, s, d = layer.shape
    if not layer.is_contiguous():
        raise ValueError(f"layer must be contiguous (strides {layer.stride()}): the identity table assumes [B, Hkv, S, D] packing")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0 or s % block_size:
        raise ValueError(f"block_size must be a positive divisor of max_seq_len {s}, got {block_size!r}")
    per_row = s // block_size  # blocks of one (row, head)
    blocks_per_batch_row = hkv * per_row
    num_blocks = (b - 1) * blocks_per_batch_row + per_row
    pool = layer.as_strided((num_blocks, block_size, hkv, d), (block_size * d, d, s * d, 1))
    return pool, _identity_tables(b, blocks_per_batch_row, per_row, layer.device)


# Identity tables depend on shapes only; built once each (the first call comes before a CUDA graph
# capture, so a captured decode step never allocates or launches for them).
_IDENTITY_TABLES: dict[tuple[int, int, int, torch.device], Tensor] = {}


def _identity_tables(batch: int, blocks_per_batch_row: int, per_row: int, device: torch.device) -> Tensor:
    """``[B, per_row]`` int32: ``tables[b, c] = b * blocks_per_batch_row + c`` (never written to)."""
    key = (batch, blocks_per_batch_row, per_row, device)
    if key not in _IDENTITY_TABLES:
        rows = torch.arange(batch, device=device, dtype=torch.int32)[:, None]
        _IDENTITY_TABLES[key] = rows * blocks_per_batch_row + torch.arange(per_row, device=device, dtype=torch.int32)[None, :]
    return _IDENTITY_TABLES[key]


__all__ = ["contiguous_layer_as_paged"]
