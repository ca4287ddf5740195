"""The members a cache with a device position shows, each read off its :class:`DevicePosition`.

The static caches (one buffer per layer, or blocks of a pool) differ in storage only; what follows
from the position on the device — the forward's step, the write check of the fused decode step,
the host counter of a replayed step — is the position's, and these members hand it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from torch import Tensor

from infer_ref.cache.base import CacheBase
from infer_ref.cache.position import DevicePosition
from infer_ref.step import Step


class DevicePositioned(CacheBase):
    """A cache whose ``position`` is a :class:`DevicePosition` (``pos``, int64 ``[1]``, on its device)."""

    position: DevicePosition

    def plan_step(self, t: int, windows: Sequence[int | None]) -> Step:
        return self.position.step(t, windows)

    def check_write(self, layer_idx: int, k: Tensor, v: Tensor) -> int:
        """Refuse a write of ``k``/``v`` ``[B, Hkv, T, D]`` into layer ``layer_idx`` that does not fit
        (layer, shapes, dtype, device; capacity unless host-frozen), before anything changes; returns T.
        ``update`` checks through it, and so does a caller that writes the layer's storage itself
        (the fast path's fused decode step)."""
        t = self._check_write(layer_idx, k, v)
        self.position.check_write_room(t)
        return t

    def advance_host(self, n: int) -> None:
        self.position.advance_host(n)

    def host_frozen(self) -> AbstractContextManager[None]:
        return self.position.host_frozen()

    def set_position(self, n: int) -> None:
        self.position.set(n)

    def positions(self, t: int) -> Tensor:
        return self.position.positions(t)

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        return self.position.attention_mask(t, window)
