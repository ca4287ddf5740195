"""Contiguous pre-allocated KV cache (seed 000 §1, plus seed 004's capacity helpers).

Two tensors hold K and V for every layer; one counter (``seq_len``) says how many positions are
filled. K is stored after QK-norm and RoPE, V raw, so cached entries are ready for attention.
Every misuse raises before anything is written: a failed call leaves the cache as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import Self

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class KVCacheOverflowError(ValueError):
    """A write or advance past ``max_seq_len``."""


class KVCache:
    """Pre-allocated contiguous KV cache.

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
    """

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0) -> None:
        if k.dim() != 5 or k.shape != v.shape:
            raise ValueError(
                "k and v must both be [num_layers, batch, num_kv_heads, max_seq_len, head_dim], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{k.device} and {v.dtype}/{v.device}")
        for name, t in (("k", k), ("v", v)):
            if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
                # An expanded tensor would make layers (or batch rows) alias one storage slice.
                raise ValueError(f"{name} broadcasts one storage slice over several entries (stride 0): allocate it")
        if not 0 <= seq_len <= k.shape[3]:
            raise ValueError(f"seq_len must be in [0, {k.shape[3]}], got {seq_len}")
        self.k = k
        self.v = v
        self._seq_len = seq_len

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
        device: str | torch.device = "cuda",
    ) -> Self:
        """Zero-filled cache tensors."""
        dims = {
            "num_layers": num_layers,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "max_seq_len": max_seq_len,
            "batch_size": batch_size,
        }
        bad = {name: value for name, value in dims.items() if isinstance(value, bool) or not isinstance(value, int) or value <= 0}
        if bad:
            raise ValueError(f"cache dimensions must be positive integers, got {bad}")
        shape = (num_layers, batch_size, num_kv_heads, max_seq_len, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        max_seq_len: int,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cuda",
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

    # -- geometry ------------------------------------------------------------------------------

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[3]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def is_full(self) -> bool:
        return self._seq_len >= self.max_seq_len

    @property
    def remaining_capacity(self) -> int:
        return self.max_seq_len - self._seq_len

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
        self._check_layer(layer_idx)
        new_len = self._check_entries(k, v)
        start = self._seq_len
        end = start + new_len
        if end > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: writing {new_len} position(s) at {start} needs position {end - 1}, "
                f"but max_seq_len is {self.max_seq_len} (remaining capacity {self.remaining_capacity})"
            )
        self.k[layer_idx, :, :, start:end] = k
        self.v[layer_idx, :, :, start:end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` (once per forward, after every layer wrote)."""
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"advance(n) needs a positive integer n, got {n!r}")
        if self._seq_len + n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: advancing by {n} from position {self._seq_len} would reach "
                f"{self._seq_len + n}, but max_seq_len is {self.max_seq_len}"
            )
        self._seq_len += n

    def reset(self) -> None:
        """Zero both tensors and restart at position 0, ready for a new request."""
        self.k.zero_()
        self.v.zero_()
        self._seq_len = 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(layers={self.num_layers}, batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, seq_len={self._seq_len}/{self.max_seq_len}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    # -- validation ----------------------------------------------------------------------------

    def _check_layer(self, layer_idx: int) -> None:
        # Negative indices are rejected too: k[-1] would silently alias the last layer.
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"layer index {layer_idx!r} out of range: cache has layers 0..{self.num_layers - 1}")

    def _check_entries(self, k: Tensor, v: Tensor) -> int:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4:
                raise ValueError(
                    f"{name} must be [batch, num_kv_heads, new_len, head_dim] (4-D), got shape {tuple(t.shape)}"
                )
            expected = (self.batch_size, self.num_kv_heads, t.shape[2], self.head_dim)
            if tuple(t.shape) != expected or t.shape[2] == 0:
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}, expected [batch={self.batch_size}, "
                    f"num_kv_heads={self.num_kv_heads}, new_len>=1, head_dim={self.head_dim}]"
                )
            if t.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, cache holds {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, cache is on {self.device}")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        return k.shape[2]
