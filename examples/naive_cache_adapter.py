"""Worked example: running the conformance suite against your own KV cache.

``AppendCache`` below is a small, independent cache: a Python list of growing tensors per layer,
no pre-allocation. ``ADAPTER`` wraps it for the suite, together with an attention mask and an
attention step written from scratch, and plugs the cache into infer_ref's models so that the
model-level properties exercise it too (any object with the cache members drives those models).

Run the conformance tests against it from the repository root (so that ``examples`` imports)::

    infer-ref conformance --impl examples.naive_cache_adapter:ADAPTER

Tests of capabilities this adapter does not provide (RoPE tables, generate, ``memory_bytes`` —
an append cache has no fixed footprint) are skipped as "not supported by naive-append-cache".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.interface.adapter import Adapter, CacheSpec


class CacheFullError(ValueError):
    """A write or advance past the cache's capacity."""


class AppendCache:
    """Per-layer lists of K/V ``[B, Hkv, T, D]``; ``update`` concatenates, ``advance`` commits."""

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self._k: list[Tensor | None] = [None] * spec.num_layers
        self._v: list[Tensor | None] = [None] * spec.num_layers
        self._len = 0

    # -- members the suite and infer_ref's models use ----------------------------------------
    @property
    def seq_len(self) -> int:
        return self._len

    @property
    def max_seq_len(self) -> int:
        return self.spec.max_seq_len

    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    @property
    def batch_size(self) -> int:
        return self.spec.batch_size

    @property
    def remaining_capacity(self) -> int:
        return self.spec.max_seq_len - self._len

    @property
    def is_full(self) -> bool:
        return self._len >= self.spec.max_seq_len

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write at ``[seq_len, seq_len + T)``; return ``[B, Hkv, seq_len + T, D]``."""
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"layer {layer_idx!r} out of range 0..{self.num_layers - 1}")
        self._check(k, "k")
        self._check(v, "v")
        if k.shape != v.shape:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
        n = k.shape[2]
        if self._len + n > self.max_seq_len:
            raise CacheFullError(f"writing {n} at {self._len} exceeds capacity {self.max_seq_len}")
        kept_k, kept_v = self._read(layer_idx)
        self._k[layer_idx] = torch.cat([kept_k, k], dim=2)
        self._v[layer_idx] = torch.cat([kept_v, v], dim=2)
        return self._k[layer_idx], self._v[layer_idx]  # type: ignore[return-value]

    def advance(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"advance needs a positive int, got {n!r}")
        if self._len + n > self.max_seq_len:
            raise CacheFullError(f"advance({n}) from {self._len} exceeds capacity {self.max_seq_len}")
        self._len += n

    def reset(self) -> None:
        self._k = [None] * self.num_layers
        self._v = [None] * self.num_layers
        self._len = 0

    # -- internals ----------------------------------------------------------------------------
    def _read(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        k, v = self._k[layer_idx], self._v[layer_idx]
        if k is None or v is None:
            empty = torch.empty(self.spec.entry_shape(0), dtype=self.spec.dtype, device=self.spec.device)
            return empty, empty
        return k[:, :, : self._len], v[:, :, : self._len]  # drop anything written but never advanced

    def _check(self, t: Tensor, name: str) -> None:
        if t.dim() != 4 or t.shape[2] == 0 or (t.shape[0], t.shape[1], t.shape[3]) != (
            self.spec.batch_size,
            self.spec.num_kv_heads,
            self.spec.head_dim,
        ):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {self.spec.entry_shape(-1)} with T >= 1")
        if t.dtype != self.spec.dtype:
            raise TypeError(f"{name} is {t.dtype}, cache holds {self.spec.dtype}")
        if t.device != torch.device(self.spec.device):
            raise ValueError(f"{name} is on {t.device}, cache is on {self.spec.device}")


def attention_mask(q_len: int, start: int, window: int | None) -> Tensor:
    """Bool ``[q_len, start + q_len]`` from the distance ``d = query_pos - key_pos``: ``0 <= d < window``."""
    d = torch.arange(start, start + q_len)[:, None] - torch.arange(start + q_len)[None, :]
    return (d >= 0) & (d < (window if window is not None else start + q_len + 1))


def attend(q: Tensor, k: Tensor, v: Tensor, cache: AppendCache, layer_idx: int, window: int | None, scale: float) -> Tensor:
    """Write k/v, then softmax(q K^T * scale + mask) V with K/V heads repeated for GQA."""
    start = cache.seq_len
    keys, values = cache.update(layer_idx, k, v)
    groups = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = (q @ keys.transpose(-1, -2)) * scale  # [B, H, T, S]
    scores = scores.masked_fill(~attention_mask(q.shape[2], start, window).to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ values  # [B, H, T, D]


def read_cache(cache: AppendCache, layer_idx: int) -> tuple[Tensor, Tensor]:
    return cache._read(layer_idx)


# -- model plumbing: infer_ref's decoders, driven with this cache ---------------------------------


def load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    from infer_ref import load_model as infer_ref_load_model

    model, _ = infer_ref_load_model(folder, dtype=dtype, device=device)
    return model


def make_model_cache(model: Any, max_seq_len: int, batch_size: int) -> AppendCache:
    cfg, param = model.config, next(model.parameters())
    return AppendCache(
        CacheSpec(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, cfg.computed_head_dim, max_seq_len, param.dtype, str(param.device))
    )


@torch.inference_mode()
def forward(model: Any, input_ids: Tensor, cache: AppendCache | None) -> Tensor:
    return model(input_ids) if cache is None else model(input_ids, kv_cache=cache, all_logits=True)


ADAPTER = Adapter(
    name="naive-append-cache",
    version="1.0",
    description="examples/naive_cache_adapter.py: list-of-tensors cache, from-scratch mask and attention",
    make_cache=AppendCache,
    read_cache=read_cache,
    attention_mask=attention_mask,
    attend=attend,
    load_model=load_model,
    make_model_cache=make_model_cache,
    forward=forward,
)
