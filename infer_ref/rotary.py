"""Rotary position embedding applied to heads: the torch definitions (split-halves rotate_half).

The cos/sin tables ``[T, D]`` (or ``[B, T, D]``, per row) come from the model's
``RotaryEmbedding`` (float32 angles, cast to the activation dtype). Applying them in that dtype
rounds three times, as transformers does: ``round(x * cos)``, ``round(rotate_half(x) * sin)`` and
their rounded sum; the fused decode kernels reproduce exactly those roundings.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    """``cat(-x2, x1)`` over the last dimension, ``x1``/``x2`` its halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x ``[B, H, T, D]``; cos/sin ``[T, D]`` (or ``[B, T, D]``, per row) for the positions of those T tokens."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: one table per row, shared by heads
    return (x * cos) + (rotate_half(x) * sin)


def apply_rope_to_pair(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``apply_rope`` of q ``[B, H, T, D]`` and k ``[B, Hkv, T, D]`` as one rotation of their heads
    side by side: the same values (the rotation is per element, the tables shared by every head),
    with half the elementwise ops, so a compiled step rotates both in one kernel."""
    qk = apply_rope(torch.cat((q, k), dim=1), cos, sin)  # [B, H + Hkv, T, D]
    return qk[:, : q.shape[1]], qk[:, q.shape[1] :]


__all__ = ["apply_rope", "apply_rope_to_pair", "rotate_half"]
