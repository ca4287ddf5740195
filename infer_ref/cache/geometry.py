"""The shape of what a cache holds, as one value: layers, rows, KV heads, head_dim, dtype, device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CacheGeometry:
    """Every cache type reports its geometry through this value (``cache.geometry``); the familiar
    names (``cache.num_layers``, ``cache.head_dim``, ...) read it (:class:`~infer_ref.cache.base.CacheBase`)."""

    num_layers: int
    batch_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of_buffer(cls, k: Tensor) -> CacheGeometry:
        """The geometry of a ``[num_layers, batch, num_kv_heads, positions, head_dim]`` buffer."""
        layers, batch, heads, _, head_dim = k.shape
        return cls(layers, batch, heads, head_dim, k.dtype, k.device)

    @property
    def bytes_per_position(self) -> int:
        """K and V of one position in every layer and row: ``2 * L * B * Hkv * D * itemsize``."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.batch_size * self.num_kv_heads * self.head_dim * itemsize


__all__ = ["CacheGeometry"]
