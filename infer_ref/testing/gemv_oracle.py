"""Float64 oracles for the decode matrix-vector kernels, with the error bound each kernel must meet.

A kernel computing ``x @ W^T`` in float32 and rounding to a 16-bit dtype cannot be compared
bitwise with cuBLAS or with another summation order; it can be compared with the exact product,
rounded where the kernel rounds, within a bound derived from the arithmetic:

- **float32 accumulation** of ``K`` products (bf16 and fp16 products are exact in float32; float32
  products round once): ``|sum32 - sum| <= delta = (K + 2) * 2**-24 * (|x| @ |W|^T + |bias|)``
  (the standard ``gamma_K`` bound, with one more rounding for the bias addition).
- **rounding to the output dtype**: two values ``delta`` apart round at most ``delta`` plus one ulp
  apart (a value near a rounding boundary may go either way), so a linear output is within
  ``delta + ulp(|y| + delta)`` of ``round(y)``.
- **the gated epilogue** rounds ``g`` and ``u``, computes the activation in float32 from the rounded
  ``g`` and rounds it, then multiplies the rounded values in float32 and rounds. Each step passes an
  input error on through its derivative (``|silu'| <= 1.10``, ``|gelu_tanh'| <= 1.13``, so 1.13 for
  both; the product's partial derivatives are the other factor) and adds at most one ulp of its own
  rounding, plus float32 evaluation error of the activation (taken as 8 float32 ulps of ``|a| + |g|``).

``ulp(t)`` is the spacing of the output dtype at ``|t|``: ``eps * 2**floor(log2 |t|)`` (the smallest
normal's for tinier values). Everything is computed in float64 on the inputs' device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

F32_UNIT = 2.0**-24  # float32 unit roundoff
ACT_LIPSCHITZ = 1.13  # max |d act / dg| over silu and gelu-tanh
F32_ACT_ULPS = 8.0


def ulp(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Spacing of ``dtype`` at ``|t|`` (float64), the smallest normal's spacing below it."""
    info = torch.finfo(dtype)
    mag = t.abs().clamp(min=info.tiny)
    return info.eps * torch.exp2(torch.floor(torch.log2(mag)))


def round_to(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` rounded to ``dtype`` and back to float64."""
    return t.to(dtype).to(torch.float64)


def activation_f64(g: Tensor, act: str) -> Tensor:
    """The activation in float64: silu ``g / (1 + exp(-g))`` or the tanh-approximated gelu."""
    if act == "silu":
        return g / (1.0 + torch.exp(-g))
    if act == "gelu_pytorch_tanh":
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
    raise ValueError(f"unknown activation {act!r}: expected 'silu' or 'gelu_pytorch_tanh'")


def _sum_and_delta(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """Exact ``x @ W^T (+ b)`` and the float32 accumulation bound, both ``[..., N]`` float64."""
    x64, w64 = x.to(torch.float64), weight.to(torch.float64)
    y = F.linear(x64, w64)
    mags = F.linear(x64.abs(), w64.abs())
    if bias is not None:
        y = y + bias.to(torch.float64)
        mags = mags + bias.to(torch.float64).abs()
    return y, (weight.shape[1] + 2) * F32_UNIT * mags


def linear_oracle(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(want, bound)``: ``round(x @ W^T + b)`` in float64 and the largest allowed ``|got - want|``."""
    y, delta = _sum_and_delta(x, weight, bias)
    return round_to(y, x.dtype), delta + ulp(y.abs() + delta, x.dtype)


def gated_epilogue_oracle(
    g: Tensor, u: Tensor, act: str, dtype: torch.dtype, delta_g: Tensor, delta_u: Tensor
) -> tuple[Tensor, Tensor]:
    """``(want, bound)`` of ``round(round(act(round g)) * round u)`` for exact ``g, u`` known to ``delta``."""
    gq, uq = round_to(g, dtype), round_to(u, dtype)
    a = round_to(activation_f64(gq, act), dtype)
    want = round_to(a * uq, dtype)
    err_g = delta_g + ulp(g.abs() + delta_g, dtype)
    err_u = delta_u + ulp(u.abs() + delta_u, dtype)
    a_eval = F32_ACT_ULPS * F32_UNIT * (a.abs() + gq.abs())
    err_a = ACT_LIPSCHITZ * err_g + a_eval + ulp(a.abs() + ACT_LIPSCHITZ * err_g + a_eval, dtype)
    err_prod = uq.abs() * err_a + (a.abs() + err_a) * err_u
    prod_mag = (a.abs() + err_a) * (uq.abs() + err_u)
    bound = err_prod + F32_UNIT * prod_mag + ulp(prod_mag, dtype)
    return want, bound


def gated_oracle(x: Tensor, weight: Tensor, act: str) -> tuple[Tensor, Tensor]:
    """``(want, bound)`` for the gated MLP's first half, ``weight`` ``[2I, K]`` (gate rows, then up rows)."""
    y, delta = _sum_and_delta(x, weight, None)
    i = weight.shape[0] // 2
    return gated_epilogue_oracle(y[..., :i], y[..., i:], act, x.dtype, delta[..., :i], delta[..., i:])


def violations(got: Tensor, want: Tensor, bound: Tensor) -> str | None:
    """None when ``|got - want| <= bound`` everywhere (and ``got`` is finite), else a description."""
    got64 = got.to(torch.float64)
    if not torch.isfinite(got64).all():
        bad = (~torch.isfinite(got64)).nonzero()[:3].tolist()
        return f"non-finite output (an unwritten or poisoned element?) at {bad}"
    err = (got64 - want).abs()
    over = err > bound
    if not over.any():
        return None
    worst = (err - bound).flatten().argmax()
    return (
        f"{int(over.sum())} of {over.numel()} elements over the bound; worst at flat index {int(worst)}: "
        f"got {got64.flatten()[worst].item()!r}, want {want.flatten()[worst].item()!r}, "
        f"|diff| {err.flatten()[worst].item():.3g} > bound {bound.flatten()[worst].item():.3g}"
    )


__all__ = [
    "activation_f64",
    "gated_epilogue_oracle",
    "gated_oracle",
    "linear_oracle",
    "round_to",
    "ulp",
    "violations",
]
