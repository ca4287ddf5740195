"""Static-shape KV caches: fixed buffers and a device-side position, for captured decode steps.

Every shape a forward sees is fixed: ``update`` writes at the device tensor ``pos`` and returns
every slot the cache can hold, and the model takes its RoPE positions and attention masks from
the cache (:meth:`positions`, :meth:`attention_mask`) instead of from the host counter. One decode
step therefore launches the same kernels with the same arguments at every position, which is what
CUDA graphs and ``torch.compile`` need.

The masks hide every slot at or beyond ``pos + T``: buffers are allocated once, so slots past the
current position hold stale or zero entries that must never be attended. A single-token step does
not mask at all: it writes and attends in one decode step (:mod:`infer_ref.kernels.decode_step`),
whose kernel reads the length ``pos + 1`` on the device and visits only the valid prefix (a sliding layer only its window), so a step at position
100 of a 16k-slot cache reads 100 keys, not 16k.

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

from infer_ref.attention import HeadTransform, grouped_query_attention
from infer_ref.cache.contiguous import KVCache, KVCacheOverflowError
from infer_ref.kernels.decode_step import contiguous_decode_step
from infer_ref.kernels.store import store_kvcache

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class DevicePosition:
    """The write position on the device (``pos``, int64 ``[1]``) and what follows from it.

    A subclass sets ``pos``, ``_slots`` (``arange(max_seq_len)`` on the device), ``_frozen`` and
    ``_seq_len``, and provides ``max_seq_len``, ``_check_count``, ``update`` (store at
    ``positions(T)``, return every slot) and ``_decode_step`` (apply the head transform, if given, to one token's
    q ``[B, H, D]`` and k ``[B, Hkv, D]``, write its K/V at ``pos`` and attend its query over
    ``[0, pos]``: :mod:`infer_ref.kernels.decode_step`).
    ``layer_windows`` (each layer's sliding window, None for global) lets a single-token step
    attend through the decode step; without it every step uses the masked buffer.
    """

    # Tells DecoderLM.forward to take positions and masks from the cache (see cache/protocol.py).
    static_shape = True
    pos: Tensor
    _slots: Tensor
    _frozen: bool
    _seq_len: int
    _issued_masks: dict[int | None, Tensor]
    _step_lengths_memo: Tensor | None = None
    layer_windows: list[int | None] | None

    # -- the static-shape hooks used by DecoderLM.forward --------------------------------------

    def positions(self, t: int) -> Tensor:
        """Absolute positions ``[T]`` of the ``t`` tokens about to be written (on the device)."""
        return self.pos + self._slots[:t]

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        """``[T, S_max]`` bool: key slot ``j`` is visible to query ``i`` iff ``j <= pos+i`` (and in the window).

        Slots ``>= pos + T`` are never visible: they have not been written for this sequence.
        """
        visible = self._visible(t, window)
        if not torch.compiler.is_compiling():  # a traced step trusts its masks (no side effect to replay)
            self._issued_masks[window] = visible  # what the model hands back to attend for this window
        return visible

    def _visible(self, t: int, window: int | None) -> Tensor:
        q_pos = self.positions(t)[:, None]  # [T, 1]
        k_pos = self._slots[None, :]  # [1, S_max]
        visible = k_pos <= q_pos
        if window is not None:
            visible = visible & (k_pos > q_pos - window)
        return visible

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        """Write ``k``/``v`` and attend ``q`` ``[B, H, T, D]``: a single-token step through the
        length-aware decode step (the Triton kernels on CUDA, their references elsewhere), anything
        else over the masked buffer."""
        if self._takes_decode_step(layer_idx, q, mask):
            return self._attend_one_token(layer_idx, q, k, v, scale, None)
        keys, values = self.update(layer_idx, k, v)  # [B, Hkv, S_max, D]
        return grouped_query_attention(q, keys, values, mask, scale)

    def attend_projected(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform, mask: Tensor | None, scale: float
    ) -> Tensor:
        """:meth:`attend` with q and k before ``transform`` (per-head norms, RoPE): a single-token
        step applies it inside the decode step (one fused kernel on CUDA); anything else applies it
        here and attends over the masked buffer."""
        if self._takes_decode_step(layer_idx, q, mask):
            return self._attend_one_token(layer_idx, q, k, v, scale, transform)
        q, k = transform.apply(q, k)
        keys, values = self.update(layer_idx, k, v)  # [B, Hkv, S_max, D]
        return grouped_query_attention(q, keys, values, mask, scale)

    def _step_lengths(self) -> Tensor:
        """``[B]`` lengths after this step's write, ``pos + 1`` per row, on the device.

        Every layer of a step reads the same lengths: they are computed at the first layer and kept
        until the position moves (``advance``, ``set_position``), so an eager or captured-without-
        compile step launches their two small kernels once, not once per layer. A compiled step
        gets them fresh for every layer (no Python state in a trace); Inductor writes all of those
        copies from one small kernel.
        """
        if torch.compiler.is_compiling():
            return (self.pos + 1).expand(self.batch_size).contiguous()
        if self._step_lengths_memo is None:
            self._step_lengths_memo = (self.pos + 1).expand(self.batch_size).contiguous()
        return self._step_lengths_memo

    def _takes_decode_step(self, layer_idx: int, q: Tensor, mask: Tensor | None) -> bool:
        return q.shape[2] == 1 and self.layer_windows is not None and self._mask_is_the_layers(layer_idx, mask)

    def _attend_one_token(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, scale: float, transform: HeadTransform | None
    ) -> Tensor:
        """q ``[B, H, 1, D]``, k/v ``[B, Hkv, 1, D]`` -> ``[B, H, 1, D]`` through the decode step."""
        assert self.layer_windows is not None
        self._check_layer(layer_idx)
        self._check_entries(k, v)
        if not self._frozen:
            self._check_capacity(1)
        window = self.layer_windows[layer_idx]
        out = self._decode_step(layer_idx, q[:, :, 0], k[:, :, 0], v[:, :, 0], scale, window, transform)
        return out[:, :, None]  # [B, H, 1, D]

    def _mask_is_the_layers(self, layer_idx: int, mask: Tensor | None) -> bool:
        """Whether ``mask`` is this layer's causal/window mask, so the decode step (which applies the
        layer's window, not a mask) computes what the caller asked for.

        The model passes back the mask :meth:`attention_mask` issued (checked by identity, free);
        another caller's mask (a test's own window, say) is compared by value, and anything else
        takes the masked path. A traced or captured step is the model's: trusted without a check,
        which would need a host sync.
        """
        assert self.layer_windows is not None
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < len(self.layer_windows) or mask is None:
            return False
        window = self.layer_windows[layer_idx]
        if torch.compiler.is_compiling() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
            return True
        if self._issued_masks.get(window) is mask:
            return True
        own = self._visible(1, window)
        return mask.shape == own.shape and mask.dtype == own.dtype and bool(torch.equal(mask, own))

    # -- the two counters ------------------------------------------------------------------------

    def advance(self, n: int) -> None:
        """Move the device position (and, unless frozen, the host counter) forward by ``n``."""
        self._check_count("advance(n)", n)
        if not self._frozen:
            self._check_capacity(n)
            self._seq_len += n
        self.pos.add_(n)
        self._step_lengths_memo = None

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
        self._step_lengths_memo = None
        self._seq_len = n

    def _check_capacity(self, n: int) -> None:
        if self._seq_len + n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: {n} position(s) at {self._seq_len} need position {self._seq_len + n - 1}, "
                f"but max_seq_len is {self.max_seq_len}"
            )

    if TYPE_CHECKING:  # provided by the storage class (declared for the type checker only: no shadowing)

        @property
        def max_seq_len(self) -> int: ...

        @property
        def batch_size(self) -> int: ...

        def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...

        def _decode_step(
            self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None, transform: HeadTransform | None
        ) -> Tensor: ...

        def _check_layer(self, layer_idx: int) -> None: ...

        def _check_entries(self, k: Tensor, v: Tensor) -> int: ...

        @staticmethod
        def _check_count(name: str, n: int, *, allow_zero: bool = False) -> None: ...


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
        layer_windows: each layer's sliding window (None: global), or None when unknown (then no
            step uses the decode kernel). ``from_model_config`` sets it from the model.
    """

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0, *, layer_windows: Sequence[int | None] | None = None) -> None:
        super().__init__(k, v, seq_len)
        self.layer_windows = check_layer_windows(layer_windows, k.shape[0])
        self.pos = torch.full((1,), seq_len, dtype=torch.long, device=k.device)
        self._slots = torch.arange(k.shape[3], device=k.device)  # [S_max] key positions
        rows_heads = k.shape[1] * k.shape[2]
        self._head_starts = torch.arange(rows_heads, device=k.device)[:, None] * k.shape[3]  # [B*Hkv, 1]: slot of position 0
        self._frozen = False
        self._issued_masks: dict[int | None, Tensor] = {}

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
        """A cache sized for ``config``, with the model's sliding windows (decode kernel enabled)."""
        from infer_ref.cache.paged import model_layer_windows

        cache = super().from_model_config(config, max_seq_len, batch_size=batch_size, dtype=dtype, device=device)
        cache.layer_windows = check_layer_windows(model_layer_windows(config), cache.num_layers)
        return cache

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at slots ``pos .. pos+T-1``; return the whole layer buffers."""
        self._check_layer(layer_idx)
        t = self._check_entries(k, v)
        if not self._frozen:
            self._check_capacity(t)
        positions = self.positions(t)  # [T]
        # Through store_kvcache (the Triton store on CUDA): it writes in place, also inside
        # torch.compile, where a traced index_copy_ into the buffer is functionalized into a copy of
        # the whole layer every step. The layer goes in as a contiguous view, [B*Hkv, S, 1, D], one
        # row per (row, head, position): torch.compile may re-lay out a permuted view it hands a
        # Triton kernel, and the kernel would then write through the wrong strides.
        b, hkv, _, d = k.shape
        s_max = self.max_seq_len
        slots = (self._head_starts + positions[None, :]).reshape(-1)  # [B*Hkv*T]: (b, h, p) -> (b*Hkv + h)*S + p
        store_kvcache(
            k.reshape(b * hkv * t, 1, d), v.reshape(b * hkv * t, 1, d),
            self.k[layer_idx].view(b * hkv, s_max, 1, d), self.v[layer_idx].view(b * hkv, s_max, 1, d), slots,
        )  # fmt: skip
        return self.k[layer_idx], self.v[layer_idx]  # [B, Hkv, S_max, D]

    def _decode_step(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None, transform: HeadTransform | None
    ) -> Tensor:
        return contiguous_decode_step(q, k, v, self.k, self.v, layer_idx, self._step_lengths(), scale, window, transform)

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
