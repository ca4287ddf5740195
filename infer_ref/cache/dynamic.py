"""Dynamic KV cache: no capacity, each layer grows by concatenation.

Each layer holds K and V ``[B, Hkv, S, D]`` tensors that grow with every write: ``update`` builds
``cat(held, new)`` along the position axis (one token per decode step, a whole prompt at prefill). Nothing is allocated up front, so ``memory_bytes`` grows linearly with the positions
held; the price is a copy of the whole layer at every step (O(n²) bytes over n steps), which is why
paged blocks replace it in serving engines.

A write always lands at ``seq_len``: a layer whose tensor is longer (a forward that failed half-way,
after some layers wrote) is cut back to ``seq_len`` first, so a refused forward never leaves
positions behind.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.base import CacheBase
from infer_ref.cache.geometry import CacheGeometry
from infer_ref.cache.position import HostPosition, check_count
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.storage import check_dims, resolve_device

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig

# No capacity: the limit the suite and generate see is "as many positions as memory allows".
UNBOUNDED = sys.maxsize


class DynamicKVCache(CacheBase):
    """KV cache whose layers grow by concatenation; ``max_seq_len`` is unbounded."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> None:
        check_dims(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, batch_size=batch_size)
        self.geometry = CacheGeometry(num_layers, batch_size, num_kv_heads, head_dim, dtype, resolve_device(device))
        self.position = HostPosition(UNBOUNDED)
        empty = self._empty()
        self._k: list[Tensor] = [empty] * num_layers  # [B, Hkv, S_i, D] each; replaced, never written in place
        self._v: list[Tensor] = [empty] * num_layers

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> Self:
        """An empty cache for ``config`` (layers, kv heads, computed head_dim)."""
        return cls(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.computed_head_dim,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
        )

    @classmethod
    def from_snapshot(cls, snapshot: KVSnapshot) -> Self:
        cache = cls(
            snapshot.num_layers,
            snapshot.num_kv_heads,
            snapshot.head_dim,
            batch_size=snapshot.batch_size,
            dtype=snapshot.dtype,
            device=snapshot.device,
        )
        cache.restore(snapshot)
        return cache

    # -- geometry ------------------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Bytes of the tensors held: ``2 * L * B * Hkv * seq_len * D * itemsize`` after a full forward (the positions held, not a capacity)."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self._k, self._v, strict=True))

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``/``v`` ``[B, Hkv, T, D]`` at ``seq_len``; return the layer's K/V ``[B, Hkv, seq_len+T, D]``."""
        self._check_write(layer_idx, k, v)
        held = self.seq_len
        # torch.cat copies: the new tensors own their memory, so the caller's k/v can change freely.
        self._k[layer_idx] = torch.cat((self._k[layer_idx][:, :, :held], k), dim=2)
        self._v[layer_idx] = torch.cat((self._v[layer_idx][:, :, :held], v), dim=2)
        return self._k[layer_idx], self._v[layer_idx]

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n``; every layer must hold the positions first."""
        check_count("advance(n)", n)
        at = self.seq_len
        short = [i for i, k in enumerate(self._k) if k.shape[2] < at + n]
        if short:
            raise ValueError(
                f"advance({n}) from {at} needs every layer to hold {at + n} positions; "
                f"layer(s) {short[:8]} hold fewer (a dynamic cache has no unwritten slots to advance over)"
            )
        self.position.advance(n)

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (speculative decoding drops rejected tokens this way)."""
        self._check_crop(n)
        self._k = [k[:, :, :n].clone() for k in self._k]  # clone: release the dropped tail's memory
        self._v = [v[:, :, :n].clone() for v in self._v]
        self.position.set(n)

    def reset(self) -> None:
        """Drop every position; memory goes back to zero."""
        empty = self._empty()
        self._k = [empty] * self.num_layers
        self._v = [empty] * self.num_layers
        self.position.set(0)

    def get_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s K and V ``[B, Hkv, seq_len, D]`` (``[B, Hkv, 0, D]`` when empty)."""
        self._check_layer(layer_idx)
        n = self.seq_len
        return self._k[layer_idx][:, :, :n], self._v[layer_idx][:, :, :n]

    def __repr__(self) -> str:
        return (
            f"DynamicKVCache(layers={self.num_layers}, batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, seq_len={self.seq_len}, dtype={self.dtype}, device={self.device})"
        )

    # -- helpers -------------------------------------------------------------------------------

    def _empty(self) -> Tensor:
        return torch.empty(
            (self.batch_size, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype, device=self.device
        )

    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        self._k = [layer.clone() for layer in keys]  # [B, Hkv, S, D] each, the cache's own memory
        self._v = [layer.clone() for layer in values]
        self.position.set(keys.shape[3])

    def _snapshot_settings(self) -> dict[str, Any]:
        return {}
