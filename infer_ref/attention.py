"""Grouped-query attention over the keys a query sees: the torch definitions.

Shapes: B batch, T new tokens (queries), S keys, H query heads, Hkv key/value heads, D head_dim.
A mask is bool, True where a query may see a key: ``[T, S]`` when every row of the batch sits at the
same positions, ``[B, T, S]`` when rows hold different lengths (a batch of requests); which keys
those are is defined in ``infer_ref/masks.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch.nn.functional as F
from torch import Tensor

from infer_ref.rotary import apply_rope_to_pair


def grouped_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Attention of H query heads over Hkv key/value heads, without copying K/V.

    q ``[B, H, T, D]``, k/v ``[B, Hkv, S, D]``, mask ``[T, S]`` or ``[B, T, S]`` bool, or None ->
    ``[B, H, T, D]``. The G = H/Hkv query heads that share a KV head are folded into the query axis:
    ``[B, Hkv, G*T, D]`` (a view when T == 1), row ``g*T + i`` being query ``i`` of head ``g``, and
    the mask is tiled to ``[G*T, S]``. Each row is attended on its own, so this equals attending
    over K/V repeated G times (query head ``h`` reads KV head ``h // G``), but reads the cache once
    instead of writing G copies of it.
    """
    b, h, t, d = q.shape
    groups = h // k.shape[1]
    q = q.reshape(b, h // groups, groups * t, d)  # [B, Hkv, G*T, D]
    if mask is not None and mask.dim() == 3:
        mask = mask.repeat(1, groups, 1)[:, None]  # [B, 1, G*T, S]: one mask per row, shared by heads
    elif mask is not None and t > 1 and groups > 1:
        mask = mask.repeat(groups, 1)  # [G*T, S]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, Hkv, G*T, D]
    return out.reshape(b, h, t, d)  # a copy when the kernel wrote [B, G*T, Hkv, D] memory (flash does)


class WritesKV(Protocol):
    """A KV cache as attention uses it (``infer_ref.cache.protocol.KVCacheProtocol`` has more)."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


def cached_attention(
    cache: WritesKV | None, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """The reference attention over a cache: write ``k``/``v`` ``[B, Hkv, T, D]`` (already normed and
    rotated) through ``update``, then attend ``q`` ``[B, H, T, D]`` over what the layer holds with
    ``mask`` (the step's for the layer): ``[B, H, T, D]``. Without a cache, over ``k``/``v`` themselves."""
    keys, values = (k, v) if cache is None else cache.update(layer_idx, k, v)  # [B, Hkv, S, D]
    return grouped_query_attention(q, keys, values, mask, scale)


class HeadTransform(NamedTuple):
    """What a layer does to q and k between their projection and attention: the per-head RMSNorms
    (Qwen3, Gemma 3; None for Llama), then RoPE with the tables of the new tokens' positions.

    The reference attention calls :meth:`apply`; the fast path's fused decode step
    (``infer_ref/fast/decode_step.py``) takes q and k before it and applies it inside its kernel.
    The norms are the model's modules (anything with ``__call__`` and a ``spec``:
    ``infer_ref.norm.NormSpec``), so the eager path runs exactly the model's code.
    """

    cos: Tensor  # [T, D], or [B, T, D] per row
    sin: Tensor
    q_norm: Callable[[Tensor], Tensor] | None = None
    k_norm: Callable[[Tensor], Tensor] | None = None

    def apply(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q ``[B, H, T, D]``, k ``[B, Hkv, T, D]`` -> both normed (per head) and rotated. V is never touched."""
        if self.q_norm is not None:
            q = self.q_norm(q)  # per-head norm, before RoPE
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope_to_pair(q, k, self.cos, self.sin)
