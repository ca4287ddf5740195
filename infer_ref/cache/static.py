"""Static-shape KV caches: fixed buffers and a device-side position, for captured decode steps.

Every shape a forward sees is fixed: ``update`` writes at the device tensor ``pos`` and returns
every slot the cache can hold, and the forward's step (:meth:`~infer_ref.cache.position.DevicePosition.step`) takes its
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

Two storages hold that position (a :class:`~infer_ref.cache.position.DevicePosition`, each cache's
``position``): :class:`StaticKVCache`, one contiguous buffer per layer, and
:class:`~infer_ref.cache.static_paged.StaticPagedKVCache`, blocks of a pool. Each forwards the
position's members (``pos``, ``advance_host``, ``host_frozen``, ``set_position``, ...) unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.device_positioned import DevicePositioned
from infer_ref.cache.position import DevicePosition
from infer_ref.cache.slots import StoreFn, store_rows
from infer_ref.cache.windows import check_layer_windows, model_layer_windows

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class StaticKVCache(DevicePositioned, KVCache):
    """Pre-allocated contiguous KV cache with the write position on the device.

    Storage, geometry, validation and errors are :class:`KVCache`'s; what differs is the position
    (a :class:`~infer_ref.cache.position.DevicePosition`: where writes land, what the step reads)
    and what ``update`` returns (the whole buffer).

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
        pos: int64 ``[1]`` on the cache's device, the position of the next write (``position.pos``).
        layer_windows: each layer's sliding window (None: global), or None when unknown; kept in
            snapshots. ``from_model_config`` sets it from the model.
    """

    position: DevicePosition

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0, *, layer_windows: Sequence[int | None] | None = None) -> None:
        super().__init__(k, v, seq_len)  # checks the buffers and seq_len
        self.layer_windows = check_layer_windows(layer_windows, k.shape[0])
        self.position = DevicePosition(k.shape[3], k.shape[3], k.shape[1], k.device, start=seq_len)
        self.pos = self.position.pos  # the same tensor, never rebound
        rows_heads = k.shape[1] * k.shape[2]
        self._head_starts = torch.arange(rows_heads, device=k.device)[:, None] * k.shape[3]  # [B*Hkv, 1]: slot of position 0

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

    # ``crop``, ``reset`` and ``restore`` are :class:`KVCache`'s: they set the position, and a device
    # position moves ``pos`` with the host counter (buffers and ``pos`` keep their addresses).

    # -- the device position: DevicePositioned's members, plus advance --------------------------

    def advance(self, n: int) -> None:
        # Not KVCache's: update never records writes here (the captured step writes every layer).
        self.position.advance(n)
