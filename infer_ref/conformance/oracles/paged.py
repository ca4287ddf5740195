"""Paged layouts for tests: contiguous K/V scattered into randomly permuted physical blocks.

Written with plain slicing, sharing no code with ``infer_ref.fast.kernels`` (whose reads it checks).
Every slot that holds no live entry (the tail of a row's last block, spare blocks, the blocks that
stale table entries point at) is filled with ``fill`` (NaN by default), so a reader that touches
one shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PagedLayout:
    """One layer's pools ``[num_blocks, bs, Hkv, D]``, tables ``[B, M]`` and lengths ``[B]`` (int32)."""

    k_pool: Tensor
    v_pool: Tensor
    block_tables: Tensor
    seq_lens: Tensor

    @property
    def block_size(self) -> int:
        return self.k_pool.shape[1]


def scatter_to_paged(
    k: Tensor,
    v: Tensor,
    lengths: Sequence[int],
    block_size: int,
    *,
    generator: torch.Generator,
    spare_blocks: int = 2,
    stale_entries: int = 1,
    fill: float = float("nan"),
) -> PagedLayout:
    """Scatter rows of ``k``/``v`` ``[B, Hkv, L, D]`` (first ``lengths[b]`` positions) into pools.

    Physical block ids are a random permutation (``randperm`` from ``generator``); each table has
    ``stale_entries`` columns past the longest row's ``ceil(len / bs)``, and every column past a
    row's own ``ceil(len / bs)`` points at a spare (``fill``-filled) block.
    """
    b, hkv, _, d = k.shape
    needed = [-(-n // block_size) for n in lengths]
    used = sum(needed)
    total = used + max(spare_blocks, 1)
    physical = torch.randperm(total, generator=generator).tolist()
    spare = physical[used:]
    width = max(needed, default=0) + stale_entries
    tables = torch.empty(b, width, dtype=torch.int32)
    k_pool = torch.full((total, block_size, hkv, d), fill, dtype=k.dtype)
    v_pool = torch.full((total, block_size, hkv, d), fill, dtype=v.dtype)
    next_block = 0
    for row, (n, blocks) in enumerate(zip(lengths, needed, strict=True)):
        for c in range(width):
            if c >= blocks:
                tables[row, c] = spare[c % len(spare)]
                continue
            phys = physical[next_block]
            next_block += 1
            tables[row, c] = phys
            first, last = c * block_size, min((c + 1) * block_size, n)
            k_pool[phys, : last - first] = k[row, :, first:last].transpose(0, 1)  # [m, Hkv, D]
            v_pool[phys, : last - first] = v[row, :, first:last].transpose(0, 1)
    seq_lens = torch.tensor(list(lengths), dtype=torch.int32)
    return PagedLayout(k_pool, v_pool, tables, seq_lens)


def relabel_blocks(layout: PagedLayout, generator: torch.Generator) -> PagedLayout:
    """The same logical contents under a fresh permutation of physical block ids."""
    perm = torch.randperm(layout.k_pool.shape[0], generator=generator)  # old id -> new id
    inverse = torch.argsort(perm)
    return PagedLayout(
        k_pool=layout.k_pool[inverse],  # new block perm[i] holds old block i
        v_pool=layout.v_pool[inverse],
        block_tables=perm[layout.block_tables.long()].to(torch.int32),
        seq_lens=layout.seq_lens,
    )


def to_device(layout: PagedLayout, device: torch.device | str) -> PagedLayout:
    return PagedLayout(*(t.to(device) for t in (layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens)))


__all__ = ["PagedLayout", "relabel_blocks", "scatter_to_paged", "to_device"]
