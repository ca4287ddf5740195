"""Static-shape KV cache: fixed buffers and a device-side position, for captured decode steps.

Same storage as :class:`~infer_ref.cache.contiguous.KVCache` (``[L, B, Hkv, S_max, D]``), but
every shape a forward sees is fixed: ``update`` writes at the device tensor ``pos`` with
``index_copy_`` and returns the whole ``S_max`` buffer, and the model takes its RoPE positions
and attention masks from the cache (:meth:`positions`, :meth:`attention_mask`) instead of from
the host counter. One decode step therefore launches the same kernels with the same arguments at
every position, which is what CUDA graphs and ``torch.compile`` need.

The masks hide every slot at or beyond ``pos + T``: buffers are allocated once, so slots past the
current position hold stale or zero entries that must never be attended.

The host counter ``seq_len`` mirrors ``pos`` for bookkeeping (capacity checks, timing). Inside
:meth:`host_frozen` it is left alone, so one traced or captured step can be replayed many times;
the replaying code moves it with :meth:`advance_host` after each replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache, KVCacheOverflowError


class StaticKVCache(KVCache):
    """Pre-allocated KV cache with the write position on the device.

    Storage, geometry, validation and errors are :class:`KVCache`'s; what differs is where writes
    land (the device position ``pos``) and what ``update`` returns (the whole buffer).

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
        pos: int64 ``[1]`` on the cache's device, the position of the next write.
    """

    # Tells DecoderLM.forward to take positions and masks from the cache (see cache/protocol.py).
    static_shape = True

    def __init__(self, k: Tensor, v: Tensor, seq_len: int = 0) -> None:
        super().__init__(k, v, seq_len)
        self.pos = torch.full((1,), seq_len, dtype=torch.long, device=k.device)
        self._slots = torch.arange(k.shape[3], device=k.device)  # [S_max] key positions
        self._frozen = False

    # -- the static-shape hook used by DecoderLM.forward ------------------------------------------

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

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at slots ``pos .. pos+T-1``; return the whole layer buffers."""
        self._check_layer(layer_idx)
        t = self._check_entries(k, v)
        if not self._frozen:
            self._check_capacity(t)
        index = self.positions(t)  # [T]
        self.k[layer_idx].index_copy_(2, index, k)
        self.v[layer_idx].index_copy_(2, index, v)
        return self.k[layer_idx], self.v[layer_idx]  # [B, Hkv, S_max, D]

    def advance(self, n: int) -> None:
        """Move the device position (and, unless frozen, the host counter) forward by ``n``."""
        self._check_count("advance(n)", n)
        if not self._frozen:
            self._check_capacity(n)
            self._seq_len += n
        self.pos.add_(n)

    def advance_host(self, n: int) -> None:
        """Host bookkeeping for a replayed step whose captured ``advance`` already moved ``pos``."""
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

    def _check_capacity(self, n: int) -> None:
        if self._seq_len + n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: {n} position(s) at {self._seq_len} need position {self._seq_len + n - 1}, "
                f"but max_seq_len is {self.max_seq_len}"
            )
