"""RMSNorm as the kernels take it: a weight, an epsilon and which of the two formulas.

The two formulas (transformers' own, rounding included; ``x`` in the activation dtype):

- Llama/Qwen (``unit_offset=False``): normalise in float32, round to the activation dtype, then
  multiply by the weight in that dtype (one more rounding): ``w * round(x32 * rstd)``;
- Gemma (``unit_offset=True``): ``x32 * rstd * (1 + w32)`` entirely in float32, rounded once.

``rstd = rsqrt(mean(x32 ** 2) + eps)`` over the last dimension. :func:`rms_norm` is the definition
the model's norm modules compute and every kernel that fuses a norm (a projection's prologue or
epilogue, the per-head norms of the decode attention) is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class NormSpec:
    """One RMSNorm over the last dimension: ``weight`` ``[D]``, ``eps``, and the formula
    (``unit_offset``: Gemma's ``1 + w`` in float32 with one rounding; else Llama's)."""

    weight: Tensor
    eps: float
    unit_offset: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.weight, Tensor) or self.weight.dim() != 1:
            shape = tuple(self.weight.shape) if isinstance(self.weight, Tensor) else type(self.weight).__name__
            raise ValueError(f"NormSpec.weight must be a 1-D tensor [D], got {shape}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ValueError(f"NormSpec.eps must be a positive number, got {self.eps!r}")
        if not isinstance(self.unit_offset, bool):
            raise TypeError(f"NormSpec.unit_offset must be a bool, got {self.unit_offset!r}")

    def __call__(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, unit_offset=self.unit_offset)


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, unit_offset: bool = False) -> Tensor:
    """The definition (module docstring): ``x`` ``[..., D]`` -> ``[..., D]`` in ``x``'s dtype
    (Llama's formula: in the promotion of ``x``'s and the weight's dtypes, as torch multiplies)."""
    if unit_offset:
        return F.rms_norm(x.float(), weight.shape, 1.0 + weight.float(), eps).type_as(x)
    # F.rms_norm is x * rsqrt(mean(x^2) + eps): one fused kernel on CUDA instead of five.
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


__all__ = ["NormSpec", "rms_norm"]
