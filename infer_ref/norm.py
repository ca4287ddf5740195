"""RMSNorm as the kernels take it: a weight, an epsilon and which of the two formulas.

The two formulas (transformers' own, rounding included; ``x`` in the activation dtype, ``c`` the
compute dtype: float32 for an activation dtype below it, else the activation dtype itself):

- Llama/Qwen (``unit_offset=False``): normalise in ``c``, round to the activation dtype, then
  multiply by the weight in that dtype (one more rounding): ``w * round(xc * rstd)``;
- Gemma (``unit_offset=True``): ``xc * rstd * (1 + wc)`` entirely in ``c``, rounded once.

``rstd = rsqrt(mean(xc ** 2) + eps)`` over the last dimension. In float64 nothing is rounded to
float32 (transformers casts to float32 even there; the kit's float64 oracle lifts that cast, see
docs/conformance.md "The float64 oracle"); bfloat16/float16/float32 compute exactly as transformers. :func:`rms_norm` is the definition
the model's norm modules compute and every kernel that fuses a norm (a projection's prologue or
epilogue, the per-head norms of the decode attention) is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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
    compute = norm_compute_dtype(x.dtype)
    if unit_offset:
        return F.rms_norm(x.to(compute), weight.shape, 1.0 + weight.to(compute), eps).type_as(x)
    # F.rms_norm is x * rsqrt(mean(x^2) + eps): one fused kernel on CUDA instead of five.
    return weight * F.rms_norm(x.to(compute), weight.shape, eps=eps).to(x.dtype)


def norm_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for activations below it (bfloat16, float16), else the activation dtype (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


__all__ = ["NormSpec", "norm_compute_dtype", "rms_norm"]
