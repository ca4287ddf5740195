"""What a KV cache must provide to the models and to the conformance suite.

The models call ``seq_len``, ``update`` and ``advance`` (and ``num_layers`` / ``remaining_capacity``
to refuse a forward before anything is written); ``generate`` and the suite also use the capacity
helpers. Any object with these members can be driven by infer_ref's models and tested by
``infer_ref.conformance``.

Three optional members let a cache decide more of the forward; the model asks for them through the
helpers below, never by looking at the cache's type:

``positions(t) -> Tensor``
    Absolute positions of the ``t`` tokens about to be written: ``[T]`` (every row alike) or
    ``[B, T]`` (rows of different lengths). Default: ``seq_len .. seq_len+t-1``.
``attention_mask(t, window) -> Tensor | None``
    Bool ``[T, S]`` or ``[B, T, S]``, True where query ``i`` may see key slot ``j`` of the K/V that
    ``update`` returns (``S`` is their length). Default: the causal / sliding mask over
    ``[0, seq_len+t)`` (:func:`infer_ref.attention.attention_mask`).
``attend(layer_idx, q, k, v, mask, scale) -> Tensor``
    Write ``k``/``v`` and attend ``q`` over what the layer then holds, in one call, so a cache can
    use a kernel that reads its own layout (a paged decode kernel reads through the block table
    instead of gathering). Default: ``update`` then :func:`infer_ref.attention.grouped_query_attention`.
``attend_projected(layer_idx, q, k, v, transform, mask, scale) -> Tensor``
    As ``attend``, but with q and k as the projection produced them: the cache applies
    ``transform`` (:class:`infer_ref.attention.HeadTransform`: per-head norms, then RoPE) itself, so
    it can fuse them with its write and its attention into one kernel (the static caches' decode
    step does). Default: ``transform.apply`` then ``attend`` (or its default).

A cache whose ``update`` returns more slots than ``seq_len + T`` (a static buffer of ``S_max``
slots, rows padded to the longest) must supply ``attention_mask`` hiding every slot that does not
hold a position ``<= pos + i`` of that row. ``static_shape = True`` additionally marks a cache whose
forward shapes never depend on the position (CUDA-graph capture); the model then prefers attention
backends that plan once per shape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from infer_ref.attention import HeadTransform, attention_mask, grouped_query_attention


@runtime_checkable
class KVCacheProtocol(Protocol):
    @property
    def seq_len(self) -> int:
        """Positions filled so far (the RoPE offset of the next token)."""
        ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at ``[seq_len, seq_len+T)``; return K/V for ``[0, seq_len+T)``."""
        ...

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` once every layer has written its entries."""
        ...

    def reset(self) -> None: ...

    @property
    def is_full(self) -> bool: ...

    @property
    def remaining_capacity(self) -> int: ...


@runtime_checkable
class StaticShapeKVCacheProtocol(KVCacheProtocol, Protocol):
    """A cache whose forward shapes do not depend on the position (see the module docstring)."""

    static_shape: bool  # True

    def positions(self, t: int) -> Tensor:
        """Absolute positions ``[T]`` (int64, on the cache's device) of the ``t`` tokens being written."""
        ...

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        """``[T, S_max]`` bool, True where query ``i`` may attend key slot ``j``."""
        ...


def write_positions(cache: KVCacheProtocol | None, t: int, device: torch.device) -> Tensor:
    """Absolute positions ``[T]`` or ``[B, T]`` of the ``t`` tokens a forward writes into ``cache``."""
    if cache is None:
        return torch.arange(t, device=device)
    supplied = getattr(cache, "positions", None)
    if callable(supplied):
        return supplied(t)
    start = cache.seq_len
    return torch.arange(start, start + t, device=device)


def key_mask(cache: KVCacheProtocol | None, t: int, window: int | None, device: torch.device) -> Tensor | None:
    """The mask for ``t`` new queries over the K/V ``cache.update`` returns (None: all visible)."""
    if cache is None:
        return attention_mask(t, 0, window, device)
    supplied = getattr(cache, "attention_mask", None)
    if callable(supplied):
        return supplied(t, window)
    return attention_mask(t, cache.seq_len, window, device)


def cached_attention(
    cache: KVCacheProtocol,
    layer_idx: int,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float,
    transform: HeadTransform | None = None,
) -> Tensor:
    """Write ``k``/``v`` ``[B, Hkv, T, D]`` into ``cache`` and attend ``q`` ``[B, H, T, D]`` over the layer.

    With ``transform``, q and k are given before it (as projected): the cache's own
    ``attend_projected`` when it has one, else the transform is applied here. Then the cache's own
    ``attend`` when it has one, else ``update`` + grouped-query attention.
    """
    if transform is not None:
        attend_projected = getattr(cache, "attend_projected", None)
        if callable(attend_projected):
            return attend_projected(layer_idx, q, k, v, transform, mask, scale)
        q, k = transform.apply(q, k)
    attend = getattr(cache, "attend", None)
    if callable(attend):
        return attend(layer_idx, q, k, v, mask, scale)
    keys, values = cache.update(layer_idx, k, v)  # [B, Hkv, S, D]
    return grouped_query_attention(q, keys, values, mask, scale)  # [B, H, T, D]
