"""The broken pieces the model-level mutants plug in: masks that forget or shift the window,
caches that return the whole buffer, keep their length across requests, clamp on overflow or alias
one slice for every layer."""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache
from infer_ref.conformance.interface.adapter import CacheSpec
from infer_ref.masks import attention_mask

# -- broken masks --------------------------------------------------------------------------------


def mask_no_window_on_decode(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
    """The "one new token sees everything" shortcut taken without looking at the window."""
    if q_len == 1:
        return None
    return attention_mask(q_len, start, window, device)


def mask_window_off_by_one(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
    """``j >= p - window`` instead of ``j > p - window``: every query sees window + 1 keys."""
    kv_len = start + q_len
    if q_len == 1 and (window is None or kv_len <= window + 1):
        return None
    q_pos = torch.arange(start, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    visible = k_pos <= q_pos
    if window is not None:
        visible = visible & (k_pos >= q_pos - window)
    return visible


def mask_top_left_aligned(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
    """``torch.ones(T, S).tril()``: query i sees keys 0..i, as if the chunk started at position 0."""
    kv_len = start + q_len
    if q_len == 1 and (window is None or kv_len <= window):
        return None
    q_idx = torch.arange(q_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    visible = k_pos <= q_idx
    if window is not None:
        visible = visible & (k_pos > q_idx - window)
    return visible


# -- broken caches -------------------------------------------------------------------------------


class FullBufferCache(KVCache):
    """``update`` returns the whole ``max_seq_len`` buffer (a static cache read without its length):
    unwritten zero slots take part in attention."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        super().update(layer_idx, k, v)
        return self.k[layer_idx], self.v[layer_idx]


class NoRestartCache(KVCache):
    """``reset`` clears the tensors but forgets the counter: the next request starts mid-cache."""

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()


class ClampingCache(KVCache):
    """Writes past ``max_seq_len`` are truncated and ``advance`` saturates, without an error."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._check_layer(layer_idx)
        self._check_entries(k, v)
        start = self.seq_len
        end = min(start + k.shape[2], self.max_seq_len)
        self.k[layer_idx, :, :, start:end] = k[:, :, : end - start]
        self.v[layer_idx, :, :, start:end] = v[:, :, : end - start]
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"advance(n) needs a positive integer n, got {n!r}")
        self.position.seq_len = min(self.seq_len + n, self.max_seq_len)


def aliased_cache(spec: CacheSpec) -> KVCache:
    """Per-layer storage built by broadcasting one layer (``zeros(1, ...).expand(L, ...)``, the tensor
    version of ``[torch.zeros(shape)] * num_layers``): every layer reads and writes the same slice."""
    shape = (1, spec.batch_size, spec.num_kv_heads, spec.max_seq_len, spec.head_dim)
    full = (spec.num_layers, *shape[1:])
    k = torch.zeros(shape, dtype=spec.dtype, device=spec.device).expand(full)
    v = torch.zeros(shape, dtype=spec.dtype, device=spec.device).expand(full)
    return KVCache(k, v)
