"""Frozen copies of a cache's contents.

A :class:`KVSnapshot` holds its own copy of every layer's K and V for positions ``[0, seq_len)``,
in one type-neutral layout (``[L, B, Hkv, S, D]``), plus the settings its source cache type needs
to rebuild a cache like the source. Hence:

- ``cache.snapshot()`` is frozen: it shares no memory with the cache, so later writes, crops,
  resets or reuse of the cache's blocks never change it (a shallow copy that aliases the live
  buffers is the classic bug);
- ``snapshot.materialize()`` builds a new live cache of the source's type and capacity;
- ``cache.restore(snapshot)`` loads it into any cache of the same geometry, whatever its type
  (contiguous, static, dynamic, paged), in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor


class KVSnapshot:
    """K/V of ``seq_len`` positions of every layer, copied out of a cache.

    Attributes:
        keys: ``[num_layers, batch, num_kv_heads, seq_len, head_dim]`` (the snapshot's own memory).
        values: same shape as ``keys``.
        cache_type: the class that took it (``materialize`` builds one of these).
        settings: what that class needs to rebuild a cache like the source (capacity, block size, ...).
    """

    def __init__(self, keys: Tensor, values: Tensor, cache_type: type, settings: Mapping[str, Any]) -> None:
        if keys.dim() != 5 or keys.shape != values.shape:
            raise ValueError(f"keys and values must both be [L, B, Hkv, S, D], got {tuple(keys.shape)} and {tuple(values.shape)}")
        self._keys = keys
        self._values = values
        self.cache_type = cache_type
        self.settings = MappingProxyType(dict(settings))

    @property
    def keys(self) -> Tensor:
        """The stored keys. Treat as read-only: restore and materialize copy out of them."""
        return self._keys

    @property
    def values(self) -> Tensor:
        return self._values

    @property
    def num_layers(self) -> int:
        return self._keys.shape[0]

    @property
    def batch_size(self) -> int:
        return self._keys.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self._keys.shape[2]

    @property
    def seq_len(self) -> int:
        return self._keys.shape[3]

    @property
    def head_dim(self) -> int:
        return self._keys.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self._keys.dtype

    @property
    def device(self) -> torch.device:
        return self._keys.device

    @property
    def memory_bytes(self) -> int:
        return self._keys.nbytes + self._values.nbytes

    def materialize(self) -> Any:
        """A new live cache of the source's type and capacity holding these positions."""
        builder: Any = self.cache_type
        return builder.from_snapshot(self)

    def __repr__(self) -> str:
        return (
            f"KVSnapshot(of={self.cache_type.__name__}, layers={self.num_layers}, batch={self.batch_size}, "
            f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, seq_len={self.seq_len}, dtype={self.dtype})"
        )
