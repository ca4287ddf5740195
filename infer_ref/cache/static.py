"""Static-shape KV caches: fixed buffers and a device-side position, for captured decode steps.

Every shape a forward sees is fixed: ``update`` writes at the device tensor ``pos`` and returns
every slot the cache can hold, and the forward's step (:meth:`DevicePosition.plan_step`) takes its
RoPE positions, attention masks and lengths from ``pos`` instead of from the host counter. One
decode step therefore launches the same kernels with the same arguments at every position, which
is what CUDA graphs and ``torch.compile`` need.

The masks hide every slot at or beyond ``pos + T``: buffers are allocated once, so slots past the
current position hold stale or zero entries that must never be attended. The step also carries
the lengths ``pos + T`` per row on the device, so a length-aware decode kernel (the fast path's
fused decode step, ``infer_ref/fast/decode_step.py``) can attend a single token over the valid
prefix only (a sliding layer only its window) without any mask: a step at position 100 of a
16k-slot cache then reads 100 keys, not 16k.

The host counter ``seq_len`` mirrors ``pos`` for bookkeeping (capacity checks, timing). Inside
:meth:`host_frozen` it is left alone, so one traced or captured step can be replayed many times;
the replaying code moves it with :meth:`advance_host` after each replay.

Two storages share that behaviour (:class:`DevicePosition`): :class:`StaticKVCache`, one contiguous
buffer per layer, and :class:`~infer_ref.cache.static_paged.StaticPagedKVCache`, blocks of a pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.base import CacheBase
from infer_ref.cache.contiguous import KVCache, KVCacheOverflowError
from infer_ref.cache.slots import StoreFn, store_rows
from infer_ref.step import Step

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class DevicePosition(CacheBase):
    """The write position on the device (``pos``, int64 ``[1]``) and what follows from it.

    A subclass sets ``pos``, ``_slots`` (``arange(max_seq_len)`` on the device), ``_frozen`` and
    ``_seq_len``, and stores at :meth:`positions` in ``update`` (returning every slot).
    ``_block_tables`` is the paged layout's ``[B, M]`` table (None for a contiguous buffer).
    """

    pos: Tensor
    _slots: Tensor
    _frozen: bool
    _seq_len: int
    layer_windows: list[int | None] | None  # kept for snapshots: the model gives each step its windows

    # -- the step --------------------------------------------------------------------------------

    def positions(self, t: int) -> Tensor:
        """Absolute positions ``[T]`` of the ``t`` tokens about to be written (on the device)."""
        return self.pos + self._slots[:t]

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        """``[T, S_max]`` bool: key slot ``j`` is visible to query ``i`` iff ``j <= pos+i`` (and in the window).

        Slots ``>= pos + T`` are never visible: they have not been written for this sequence.
        """
        q_pos = self.positions(t)[:, None]  # [T, 1]
        k_pos = self._slots[None, :]  # [1, S_max]
        visible = k_pos <= q_pos
        if window is not None:
            visible = visible & (k_pos > q_pos - window)
        return visible

    def plan_step(self, t: int, windows: Sequence[int | None]) -> Step:
        """The forward's step, every part read from the device position (no host value in it).

        ``lengths`` (``pos + t`` per row, ``[B]``) is computed here once per forward: every layer of
        a decode step reads the same tensor, so an eager or captured step launches its two small
        kernels once, not once per layer.
        """
        return Step(
            t,
            self.positions(t),  # [T]
            tuple(windows),
            lambda window: self.attention_mask(t, window),  # [T, S_max]
            static_shape=True,
            lengths=(self.pos + t).expand(self.batch_size).contiguous(),  # [B]
            block_tables=self._block_tables,
        )

    @property
    def _block_tables(self) -> Tensor | None:
        return None

    def check_write(self, layer_idx: int, k: Tensor, v: Tensor) -> int:
        """Refuse a write of ``k``/``v`` ``[B, Hkv, T, D]`` into layer ``layer_idx`` that does not fit
        (layer, shapes, dtype, device; capacity unless host-frozen), before anything changes; returns T.
        ``update`` checks through it, and so does a caller that writes the layer's storage itself
        (the fast path's fused decode step)."""
        self._check_layer(layer_idx)
        t = self._check_entries(k, v)
        if not self._frozen:
            self._check_capacity(t)
        return t

    # -- the two counters ------------------------------------------------------------------------

    def advance(self, n: int) -> None:
        """Move the device position (and, unless frozen, the host counter) forward by ``n``."""
        self._check_count("advance(n)", n)
        if not self._frozen:
            self._check_capacity(n)
            self._seq_len += n
        self.pos.add_(n)

    def advance_host(self, n: int) -> None:
        """Host bookkeeping for a replayed step whose captured ``advance`` already moved ``pos``."""
        self._check_count("advance_host(n)", n)  # host ints only: no device work per replay
        self._check_capacity(n)
        self._seq_len += n

    @contextmanager
    def host_frozen(self) -> Iterator[None]:
        """Trace or capture a step without touching the host counter (the caller checks capacity)."""
        self._frozen = True
        try:
            yield
        finally:
            self._frozen = False

    def set_position(self, n: int) -> None:
        """Put both counters at ``n`` (entries at ``>= n`` become invisible, not erased)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.max_seq_len:
            raise ValueError(f"position must be an integer in [0, {self.max_seq_len}], got {n!r}")
        self.pos.fill_(n)
        self._seq_len = n

    def _check_capacity(self, n: int) -> None:
        if self._seq_len + n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: {n} position(s) at {self._seq_len} need position {self._seq_len + n - 1}, "
                f"but max_seq_len is {self.max_seq_len}"
            )


def check_layer_windows(windows: Sequence[int | None] | None, num_layers: int) -> list[int | None] | None:
    """``windows`` as a list (one positive int or None per layer), or None; anything else is refused."""
    if windows is None:
        return None
    out = list(windows)
    if len(out) != num_layers or any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0) for w in out):
        raise ValueError(f"layer_windows must give each of the {num_layers} layers a positive window or None, got {out}")
    return out


class StaticKVCache(DevicePosition, KVCache):
    """Pre-allocated contiguous KV cache with the write position on the device.

    Storage, geometry, validation and errors are :class:`KVCache`'s; what differs is where writes
    land (the device position ``pos``) and what ``update`` returns (the whole buffer).

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
        pos: int64 ``[1]`` on the cache's device, the position of the next write.
        layer_windows: each layer's sliding window (None: global), or None when unknown; kept in
            snapshots. ``from_model_config`` sets it from the model.
    """

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0, *, layer_windows: Sequence[int | None] | None = None) -> None:
        super().__init__(k, v, seq_len)
        self.layer_windows = check_layer_windows(layer_windows, k.shape[0])
        self.pos = torch.full((1,), seq_len, dtype=torch.long, device=k.device)
        self._slots = torch.arange(k.shape[3], device=k.device)  # [S_max] key positions
        rows_heads = k.shape[1] * k.shape[2]
        self._head_starts = torch.arange(rows_heads, device=k.device)[:, None] * k.shape[3]  # [B*Hkv, 1]: slot of position 0
        self._frozen = False

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
        """A cache sized for ``config``, with the model's sliding windows."""
        from infer_ref.cache.paged import model_layer_windows

        cache = super().from_model_config(config, max_seq_len, batch_size=batch_size, dtype=dtype, device=device)
        cache.layer_windows = check_layer_windows(model_layer_windows(config), cache.num_layers)
        return cache

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor, *, store: StoreFn = store_rows) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at slots ``pos .. pos+T-1``; return the whole layer buffers.

        ``store`` copies the rows (default: an indexed copy). The fast path passes the Triton store,
        which writes in place also inside torch.compile, where a traced ``index_copy_`` into the
        buffer is functionalized into a copy of the whole layer every step. The layer goes in as a
        contiguous view, ``[B*Hkv, S, 1, D]``, one row per (row, head, position): torch.compile may
        re-lay out a permuted view it hands a Triton kernel, and the kernel would then write
        through the wrong strides.
        """
        t = self.check_write(layer_idx, k, v)
        positions = self.positions(t)  # [T]
        b, hkv, _, d = k.shape
        s_max = self.max_seq_len
        slots = (self._head_starts + positions[None, :]).reshape(-1)  # [B*Hkv*T]: (b, h, p) -> (b*Hkv + h)*S + p
        store(
            k.reshape(b * hkv * t, 1, d), v.reshape(b * hkv * t, 1, d),
            self.k[layer_idx].view(b * hkv, s_max, 1, d), self.v[layer_idx].view(b * hkv, s_max, 1, d), slots,
        )  # fmt: skip
        return self.k[layer_idx], self.v[layer_idx]  # [B, Hkv, S_max, D]

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions; the device position moves too (buffers keep their addresses)."""
        self._check_crop(n)
        self.set_position(n)

    def _set_length(self, n: int) -> None:
        # restore() copies into the buffers in place and lands here: a captured graph stays valid.
        self.set_position(n)

    def reset(self) -> None:
        """Zero the buffers and restart at position 0 (tensor addresses are kept for captured graphs)."""
        self.k.zero_()
        self.v.zero_()
        self.set_position(0)
