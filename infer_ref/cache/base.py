"""What every infer_ref cache shares: its geometry, argument checks, byte counts and snapshots.

A subclass is a storage layout (one buffer, growing tensors, blocks of a pool) composed with a
position: it sets ``geometry`` (one :class:`~infer_ref.cache.geometry.CacheGeometry`) and
``position`` (a :class:`~infer_ref.cache.position.HostPosition` or one of its kinds: where the cache
is, and the checks on moving it), and implements ``update``, ``advance``, ``reset``, ``crop``,
:meth:`get_kv` and the two snapshot hooks (:meth:`_load_positions` and ``from_snapshot``).
Everything written once here: ``seq_len`` and ``max_seq_len`` (read off the position), the checks
that refuse a bad call before anything changes, ``used_bytes``, ``snapshot`` and ``restore``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.cache.geometry import CacheGeometry
from infer_ref.cache.position import HostPosition, check_count
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.step import Step, contiguous_step
from infer_ref.validation import check_layer_index_type


class CacheBase(ABC):
    """Geometry, validation, byte counts and snapshot/restore for the concrete caches."""

    # -- geometry ------------------------------------------------------------------------------

    # Layers, rows, KV heads, head_dim, dtype and device of what this cache holds, as one value
    # (set by each constructor; fixed for the cache's life).
    geometry: CacheGeometry
    # Where the cache is: positions held, capacity, the checks on moving them (set by each constructor).
    position: HostPosition

    @property
    def num_layers(self) -> int:
        return self.geometry.num_layers

    @property
    def batch_size(self) -> int:
        return self.geometry.batch_size

    @property
    def num_kv_heads(self) -> int:
        return self.geometry.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.geometry.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.geometry.dtype

    @property
    def device(self) -> torch.device:
        return self.geometry.device

    @property
    def seq_len(self) -> int:
        """Positions filled so far (the longest row's where rows differ: a paged view's ``lengths``)."""
        return self.position.seq_len

    @property
    def max_seq_len(self) -> int:
        return self.position.capacity

    @abstractmethod
    def get_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """What layer ``layer_idx`` holds: K and V ``[B, Hkv, seq_len, D]``."""

    @abstractmethod
    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        """Replace the contents by ``keys``/``values`` ``[L, B, Hkv, S, D]`` (checked to fit)."""

    @abstractmethod
    def _snapshot_settings(self) -> dict[str, Any]:
        """What ``from_snapshot`` needs to rebuild a cache like this one (capacity, block size, ...)."""

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` once every layer wrote those positions (default: the
        position's own checks; a layout that records its writes refuses unwritten positions too)."""
        self.position.advance(n)

    def plan_step(self, t: int, windows: Sequence[int | None]) -> Step:
        """The :class:`~infer_ref.step.Step` of a forward writing ``t`` tokens per row (built once,
        before its first layer). Default: every row holds ``seq_len`` positions and ``update`` returns
        them plus the new ones; caches laid out otherwise override it."""
        return contiguous_step(self.seq_len, t, windows, self.device)

    # -- derived -------------------------------------------------------------------------------

    @property
    def is_full(self) -> bool:
        return self.remaining_capacity <= 0

    @property
    def remaining_capacity(self) -> int:
        return self.max_seq_len - self.seq_len

    @property
    def bytes_per_position(self) -> int:
        """K and V of one position in every layer and row: ``2 * L * B * Hkv * D * itemsize``."""
        return self.geometry.bytes_per_position

    @property
    def used_bytes(self) -> int:
        """Bytes the filled positions take: ``seq_len * bytes_per_position`` (``memory_bytes`` is what is allocated)."""
        return self.seq_len * self.bytes_per_position

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> KVSnapshot:
        """A frozen copy of the contents: later writes, crops, resets or block reuse never change it."""
        layers = [self.get_kv(i) for i in range(self.num_layers)]
        keys = torch.stack([k for k, _ in layers]).clone()  # [L, B, Hkv, S, D], owned
        values = torch.stack([v for _, v in layers]).clone()
        return KVSnapshot(keys, values, type(self), self._snapshot_settings())

    def restore(self, snapshot: KVSnapshot) -> None:
        """Load ``snapshot`` into this cache in place (any cache type's snapshot of the same geometry).

        Refused, with this cache unchanged, when the geometry or dtype differs or the snapshot holds
        more positions than this cache can.
        """
        if not isinstance(snapshot, KVSnapshot):
            raise TypeError(f"restore needs a KVSnapshot, got {type(snapshot).__name__}")
        mine = (self.num_layers, self.batch_size, self.num_kv_heads, self.head_dim)
        theirs = (snapshot.num_layers, snapshot.batch_size, snapshot.num_kv_heads, snapshot.head_dim)
        if mine != theirs:
            raise ValueError(
                f"snapshot geometry (layers, batch, kv_heads, head_dim) = {theirs} does not match this cache's {mine}"
            )
        if snapshot.dtype != self.dtype:
            raise TypeError(f"snapshot holds {snapshot.dtype}, this cache holds {self.dtype}: restore never converts")
        self._check_restore_capacity(snapshot.seq_len)
        self._load_positions(snapshot.keys.to(self.device), snapshot.values.to(self.device))

    def _check_restore_capacity(self, n: int) -> None:
        if n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"snapshot holds {n} positions but this cache's max_seq_len is {self.max_seq_len}; nothing restored"
            )

    # -- validation ----------------------------------------------------------------------------

    def _check_layer(self, layer_idx: int) -> None:
        check_layer_index_type(layer_idx, self.num_layers)
        # Negative indices are rejected too: k[-1] would silently alias the last layer.
        if isinstance(layer_idx, bool) or not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"layer index {layer_idx!r} out of range: cache has layers 0..{self.num_layers - 1}")

    def _check_write(self, layer_idx: int, k: Tensor, v: Tensor) -> int:
        """A write's layer and entries (see :meth:`_check_entries`); returns ``T``."""
        self._check_layer(layer_idx)
        return self._check_entries(k, v)

    def _check_entries(self, k: Tensor, v: Tensor) -> int:
        """``k``/``v`` must be ``[B, Hkv, T>=1, D]`` in the cache's dtype and device; returns ``T``."""
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

    def _check_crop(self, n: int) -> None:
        check_count("crop(n)", n, allow_zero=True)
        if n > self.seq_len:
            raise ValueError(f"crop(n) keeps the first n positions; n={n} exceeds seq_len {self.seq_len}")
