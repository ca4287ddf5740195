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
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCacheOverflowError

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class StaticKVCache:
    """Pre-allocated KV cache with the write position on the device.

    Attributes:
        k: keys, ``[num_layers, batch, num_kv_heads, max_seq_len, head_dim]``.
        v: values, same shape as ``k``.
        pos: int64 ``[1]`` on the cache's device, the position of the next write.
    """

    # Tells DecoderLM.forward to take positions and masks from the cache (see cache/protocol.py).
    static_shape = True

    def __init__(self, k: Tensor, v: Tensor) -> None:
        if k.dim() != 5 or k.shape != v.shape:
            raise ValueError(
                "k and v must both be [num_layers, batch, num_kv_heads, max_seq_len, head_dim], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{k.device} and {v.dtype}/{v.device}")
        self.k = k
        self.v = v
        self.pos = torch.zeros(1, dtype=torch.long, device=k.device)
        self._slots = torch.arange(k.shape[3], device=k.device)  # [S_max] key positions
        self._seq_len = 0
        self._frozen = False

    @staticmethod
    def from_model_config(
        config: ModelConfig,
        max_seq_len: int,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cuda",
    ) -> StaticKVCache:
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len <= 0:
            raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_seq_len, config.computed_head_dim)
        return StaticKVCache(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
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
        return self.k.nbytes + self.v.nbytes

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
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"layer index {layer_idx!r} out of range: cache has layers 0..{self.num_layers - 1}")
        expected = (self.batch_size, self.num_kv_heads, k.shape[2], self.head_dim)
        if tuple(k.shape) != expected or k.shape != v.shape or k.shape[2] == 0:
            raise ValueError(
                f"k/v have shapes {tuple(k.shape)}/{tuple(v.shape)}, expected [batch={self.batch_size}, "
                f"num_kv_heads={self.num_kv_heads}, new_len>=1, head_dim={self.head_dim}]"
            )
        if k.dtype != self.dtype or v.dtype != self.dtype:
            raise TypeError(f"k/v have dtype {k.dtype}/{v.dtype}, cache holds {self.dtype}")
        t = k.shape[2]
        if not self._frozen:
            self._check_capacity(t)
        index = self.positions(t)  # [T]
        self.k[layer_idx].index_copy_(2, index, k)
        self.v[layer_idx].index_copy_(2, index, v)
        return self.k[layer_idx], self.v[layer_idx]  # [B, Hkv, S_max, D]

    def advance(self, n: int) -> None:
        """Move the device position (and, unless frozen, the host counter) forward by ``n``."""
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"advance(n) needs a positive integer n, got {n!r}")
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
        if not 0 <= n <= self.max_seq_len:
            raise ValueError(f"position must be in [0, {self.max_seq_len}], got {n}")
        self.pos.fill_(n)
        self._seq_len = n

    def reset(self) -> None:
        """Zero the buffers and restart at position 0 (tensor addresses are kept for captured graphs)."""
        self.k.zero_()
        self.v.zero_()
        self.set_position(0)

    def __repr__(self) -> str:
        return (
            f"StaticKVCache(layers={self.num_layers}, batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, seq_len={self._seq_len}/{self.max_seq_len}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    def _check_capacity(self, n: int) -> None:
        if self._seq_len + n > self.max_seq_len:
            raise KVCacheOverflowError(
                f"KV cache overflow: {n} position(s) at {self._seq_len} need position {self._seq_len + n - 1}, "
                f"but max_seq_len is {self.max_seq_len}"
            )
