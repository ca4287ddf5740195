"""Contiguous pre-allocated KV cache with capacity helpers.

Two tensors hold K and V for every layer; one position (a
:class:`~infer_ref.cache.position.HostPosition`, ``seq_len``) says how many positions are filled. K is stored after QK-norm and RoPE, V raw, so cached entries are ready for attention.
Writes are slice copies at ``[seq_len, seq_len + T)``. Every misuse raises before anything is
written: a failed call leaves the cache as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.base import CacheBase
from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.cache.geometry import CacheGeometry
from infer_ref.cache.position import HostPosition, LayerWrites, check_count
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.storage import check_dims, check_storage_pair, resolve_device

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig

__all__ = ["KVCache", "KVCacheOverflowError"]


class KVCache(CacheBase):
    """Pre-allocated contiguous KV cache.

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
    """

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0) -> None:
        check_storage_pair(k, v, "[num_layers, batch, num_kv_heads, max_seq_len, head_dim]")
        self.position = HostPosition(k.shape[3], seq_len)
        self.k = k
        self.v = v
        self.geometry = CacheGeometry.of_buffer(k)
        # What each layer wrote past seq_len (set by update): advance never commits positions a
        # layer did not write, which would read back as zeros.
        self._writes = LayerWrites(k.shape[0])

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> Self:
        """Zero-filled cache tensors (``device`` None: CUDA when available, else CPU)."""
        check_dims(
            num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, max_seq_len=max_seq_len, batch_size=batch_size
        )
        shape = (num_layers, batch_size, num_kv_heads, max_seq_len, head_dim)
        device = resolve_device(device)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        max_seq_len: int,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> Self:
        """A cache sized for ``config`` (layers, kv heads, computed head_dim)."""
        return cls.allocate(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.computed_head_dim,
            max_seq_len,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
        )

    @classmethod
    def from_snapshot(cls, snapshot: KVSnapshot) -> Self:
        """A new cache with the snapshot's contents and the source's capacity."""
        capacity = int(snapshot.settings.get("max_seq_len", snapshot.seq_len))
        cache = cls.allocate(
            snapshot.num_layers,
            snapshot.num_kv_heads,
            snapshot.head_dim,
            max(capacity, 1),
            batch_size=snapshot.batch_size,
            dtype=snapshot.dtype,
            device=snapshot.device,
        )
        cache.restore(snapshot)
        return cache

    # -- geometry ------------------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Bytes held by both tensors: ``2 * L * B * Hkv * S * D * itemsize``."""
        return self.k.nbytes + self.v.nbytes

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` at ``[seq_len, seq_len + new_len)`` of one layer.

        Args:
            layer_idx: layer to write, ``0 <= layer_idx < num_layers``.
            k, v: ``[batch, num_kv_heads, new_len, head_dim]``, the cache's dtype and device.

        Returns:
            Views ``[batch, num_kv_heads, seq_len + new_len, head_dim]`` of this layer's K and V.
        """
        new_len = self._check_write(layer_idx, k, v)
        start = self.seq_len
        end = start + new_len
        if not self.position.fits(new_len):
            raise KVCacheOverflowError(
                f"KV cache overflow: writing {new_len} position(s) at {start} needs position {end - 1}, "
                f"but max_seq_len is {self.max_seq_len} (remaining capacity {self.remaining_capacity})"
            )
        self._store(layer_idx, start, k, v)
        self._writes.record(layer_idx, new_len)
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` (once per forward, after every layer wrote those ``n`` positions)."""
        check_count("advance(n)", n)
        at = self.seq_len
        if not self.position.fits(n):
            raise KVCacheOverflowError(
                f"KV cache overflow: advancing by {n} from position {at} would reach "
                f"{at + n}, but max_seq_len is {self.max_seq_len}"
            )
        short = self._writes.short_of(n)
        if short:
            raise ValueError(
                f"advance({n}) from {at} needs every layer to have written positions {at}.."
                f"{at + n - 1}; layer(s) {short[:8]} hold only {at + self._writes.fewest(short)} position(s) "
                "(update every layer before advancing: unwritten positions would read back as zeros)"
            )
        self.position.advance(n)
        self._writes.commit(n)

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (drop the rest, as speculative decoding does after a rejection)."""
        self._check_crop(n)
        self._set_length(n)

    def reset(self) -> None:
        """Zero both tensors and restart at position 0, ready for a new request."""
        self.k.zero_()
        self.v.zero_()
        self._set_length(0)

    def get_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s K and V for positions ``[0, seq_len)``: views ``[B, Hkv, seq_len, D]``."""
        self._check_layer(layer_idx)
        n = self.seq_len
        return self.k[layer_idx, :, :, :n], self.v[layer_idx, :, :, :n]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(layers={self.num_layers}, batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, seq_len={self.seq_len}/{self.max_seq_len}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    # -- storage -------------------------------------------------------------------------------

    def _store(self, layer_idx: int, start: int, k: Tensor, v: Tensor) -> None:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at positions ``[start, start + T)`` of every row.

        The positions are consecutive and known on the host, so a slice copy is the whole store: one
        copy kernel per tensor. (A scatter through a slot mapping, ``store_kvcache``, costs a Triton
        launch per layer: on a GPU the eager decode step is host-bound, and that launch took the
        Llama-1B eager step from 149 to 107 tokens/s.)
        """
        end = start + k.shape[2]
        self.k[layer_idx, :, :, start:end].copy_(k)
        self.v[layer_idx, :, :, start:end].copy_(v)

    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        n = keys.shape[3]
        self.k[:, :, :, :n].copy_(keys)  # in place: tensor addresses (captured graphs) are kept
        self.v[:, :, :, :n].copy_(values)
        self.k[:, :, :, n:].zero_()
        self.v[:, :, :, n:].zero_()
        self._set_length(n)

    def _set_length(self, n: int) -> None:
        # Every length change but advance lands here (crop, reset, restore); a static cache's
        # position moves its device counter too, and restore copies in place, so a captured graph stays valid.
        self.position.set(n)
        self._writes.clear()

    def _snapshot_settings(self) -> dict[str, Any]:
        return {"max_seq_len": self.max_seq_len}
