"""Build any cache type by name, sized for a model: what ``generate``, the CLI and the benchmarks use."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import torch

from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.dynamic import DynamicKVCache
from infer_ref.cache.kinds import CACHE_KINDS, DEFAULT_BLOCK_SIZE, CacheKind
from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig

__all__ = ["CACHE_KINDS", "DEFAULT_BLOCK_SIZE", "CacheKind", "build_cache"]


def build_cache(
    kind: str,
    config: ModelConfig,
    max_seq_len: int,
    *,
    batch_size: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    scramble_seed: int | None = None,
) -> Any:
    """An empty cache of type ``kind`` holding at least ``max_seq_len`` positions per row.

    ``paged`` and ``static-paged`` get a pool of exactly the blocks the rows need; ``scramble_seed``
    shuffles its free list, so logically consecutive positions land in scattered physical blocks
    (tests use it). ``dynamic`` has no capacity. ``static`` and ``static-paged`` keep the position on
    the device (the layouts of captured decode steps: ``FastDecoder``).
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; expected one of {', '.join(CACHE_KINDS)}")
    if kind == "dynamic":
        return DynamicKVCache.from_model_config(config, batch_size=batch_size, dtype=dtype, device=device)
    if kind in ("paged", "static-paged"):
        num_blocks = batch_size * -(-max_seq_len // block_size)
        order = None
        if scramble_seed is not None:
            order = list(range(num_blocks))
            random.Random(scramble_seed).shuffle(order)
        if kind == "static-paged":
            return StaticPagedKVCache.from_model_config(
                config, max_seq_len, block_size=block_size, batch_size=batch_size, dtype=dtype, device=device, free_order=order
            )
        return PagedKVCache.from_model_config(
            config,
            num_blocks,
            block_size,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
            max_seq_len=max_seq_len,
            free_order=order,
        )
    cls = StaticKVCache if kind == "static" else KVCache
    return cls.from_model_config(config, max_seq_len, batch_size=batch_size, dtype=dtype, device=device)
