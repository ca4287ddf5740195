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

The fused stages (``in_norm``, ``out_norm``, ``residual``) are followed as **intervals**: for each
element, the oracle's value (the exact arithmetic, rounded where the kernel rounds) and the range
``[lo, hi]`` the kernel's value may take. Every rounding is monotone (round-to-nearest to float32 or
to the dtype, or float32 then the dtype), so a range of inputs to a rounding maps into the range
between the roundings of its ends:

- **the product before a later stage**: the float32 sum lies within ``delta`` of the exact ``y``
  (as above), so the rounded ``y`` lies in ``[round(y - delta), round(y + delta)]``. With sums known
  to be exact (``sums_exact``: integer-grid test inputs) ``delta = 0`` and the range is one value,
  so every later rounding is checked exactly. An input error (the normalised x below) adds
  ``h_err @ |W|^T`` to ``delta``.
- **rstd** ``= 1 / sqrt(mean(v^2) + eps)`` over ``D`` elements ``v``, each somewhere in its range:
  the exact mean square lies between the sums of the smallest and of the largest squares the ranges
  allow; float32 evaluation (D squares and D - 1 additions of positive terms in any order, the
  division by D, eps rounded to float32, its addition) stays within a factor ``1 +- gamma(D + 4)``,
  ``gamma(n) = n u / (1 - n u)``, ``u = 2**-24``; the square root and the division (or an
  approximate ``rsqrtf``, as torch's CUDA kernel may use: within 2 ulps) add at most ``8 u``
  relative. So the kernel's (and torch's) rstd lies in ``[(1 - 8u) / sqrt(V_hi), (1 + 8u) / sqrt(V_lo)]``.
- **the normalised value** ``t = v * rstd`` (float32: one more ``u``), ``t`` over the corners of
  the two ranges. This is where the kernel's normalised input may round one ulp away from the
  oracle's: an element gets a range of two values only where ``t``'s range straddles a rounding
  boundary of the dtype: at most ``4 rho / eps`` of them for rstd's relative error ``rho``
  (about ``gamma(D) / 2``) and the dtype's relative spacing ``eps/2 .. eps`` (3% for bf16 at
  D = 2048, 0.4% for fp16); the rest must match the oracle exactly. Llama's formula rounds ``t`` to the dtype, then ``w * t`` (exact in
  float32 for 16-bit operands) to the dtype: monotone in ``t`` for a fixed ``w``, so the range is
  between the images of the ends. Gemma's ``t * (1 + w)`` in float32 (``1 + w`` and the product: two
  more ``u``, whichever the association) rounds once.
- **out_norm** takes the rounded product's ranges as its input ranges: an error in ``y`` moves the
  row's mean square (through the squares' ranges) and each element itself.
- **residual**: ``round(float32(r + y))`` is monotone in ``y``: the range is the images of the ends.

The bound handed to :func:`violations` is the larger distance from the oracle's value to either end.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.norm import NormSpec

F32_UNIT = 2.0**-24  # float32 unit roundoff
ACT_LIPSCHITZ = 1.13  # max |d act / dg| over silu and gelu-tanh
F32_ACT_ULPS = 8.0
RSQRT_ERR = 8 * F32_UNIT  # rstd's square root and division (or an approximate rsqrtf), relative


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


def gamma(n: int) -> float:
    """The relative error bound of ``n`` float32 roundings: ``n u / (1 - n u)``."""
    return n * F32_UNIT / (1.0 - n * F32_UNIT)


def _sum_and_delta(
    h: Tensor, h_err: Tensor | None, weight: Tensor, bias: Tensor | None, sums_exact: bool = False
) -> tuple[Tensor, Tensor]:
    """Exact ``h @ W^T (+ b)`` and the bound on the kernel's float32 sum, both ``[..., N]`` float64.

    ``h`` (float64) is the oracle's input; the kernel's may differ by up to ``h_err`` per element
    (None: not at all), which moves the sum by up to ``h_err @ |W|^T``. ``sums_exact``: the caller
    vouches that every float32 operation of the sum is exact (products, partial sums, the bias).
    """
    w64 = weight.to(device=h.device, dtype=torch.float64)
    y = F.linear(h, w64)
    mags = F.linear(h.abs() if h_err is None else h.abs() + h_err, w64.abs())
    if bias is not None:
        y = y + bias.to(torch.float64)
        mags = mags + bias.to(torch.float64).abs()
    delta = torch.zeros_like(y) if sums_exact else (weight.shape[1] + 2) * F32_UNIT * mags
    if h_err is not None:
        delta = delta + F.linear(h_err, w64.abs())
    return y, delta


def _rstd_range(lo: Tensor, hi: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``[..., 1]`` bounds on a float32 rstd of rows whose elements lie in ``[lo, hi]`` (docstring)."""
    d = lo.shape[-1]
    sq_hi = torch.maximum(lo * lo, hi * hi)
    sq_lo = torch.where((lo <= 0) & (hi >= 0), torch.zeros_like(lo), torch.minimum(lo * lo, hi * hi))
    g = gamma(d + 4)
    v_lo = (sq_lo.sum(-1, keepdim=True) / d + eps) * (1.0 - g)
    v_hi = (sq_hi.sum(-1, keepdim=True) / d + eps) * (1.0 + g)
    return v_hi.rsqrt() * (1.0 - RSQRT_ERR), v_lo.rsqrt() * (1.0 + RSQRT_ERR)


def _ordered(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return torch.minimum(a, b), torch.maximum(a, b)


def rms_norm_oracle(
    value: Tensor, lo: Tensor, hi: Tensor, norm: NormSpec, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``(want, lo, hi)`` of ``rms_norm`` over the last dimension (module docstring), float64 ``[..., D]``.

    ``value``: the oracle's input (float64 holding ``dtype`` values); ``lo <= value <= hi``: the range
    of the kernel's input element by element (``lo = hi = value`` for an exact input).
    """
    w = norm.weight.to(device=value.device, dtype=torch.float64)
    rstd = ((value * value).mean(-1, keepdim=True) + norm.eps).rsqrt()
    r_lo, r_hi = _rstd_range(lo, hi, norm.eps)
    # t = v * rstd for v in [lo, hi], rstd in [r_lo, r_hi] (positive): the corners, then float32's u.
    t_lo = torch.minimum(lo * r_lo, lo * r_hi)
    t_hi = torch.maximum(hi * r_lo, hi * r_hi)
    t_lo, t_hi = t_lo - F32_UNIT * t_lo.abs(), t_hi + F32_UNIT * t_hi.abs()
    if norm.unit_offset:  # Gemma: round(t * (1 + w)), two more float32 roundings
        g = 1.0 + w
        want = round_to(value * rstd * g, dtype)
        a_lo, a_hi = _ordered(t_lo * g, t_hi * g)
        a_lo, a_hi = a_lo - 2 * F32_UNIT * a_lo.abs(), a_hi + 2 * F32_UNIT * a_hi.abs()
        return want, round_to(a_lo, dtype), round_to(a_hi, dtype)
    # Llama: round(w * round(t)); the product is exact in float64 and rounded once (for 16-bit
    # operands it is exact in float32 too, so the kernel's float32 step adds nothing).
    want = round_to(w * round_to(value * rstd, dtype), dtype)
    ends = round_to(w * round_to(t_lo, dtype), dtype), round_to(w * round_to(t_hi, dtype), dtype)
    return (want, *_ordered(*ends))


def residual_oracle(
    residual: Tensor, value: Tensor, lo: Tensor, hi: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``(want, lo, hi)`` of ``round(float32(residual + y))`` for ``y`` in ``[lo, hi]`` (the oracle's:
    ``value``), all ``[..., N]`` float64."""
    r = residual.to(device=value.device, dtype=torch.float64)

    def add(y: Tensor) -> Tensor:
        return round_to(round_to(r + y, torch.float32), dtype)

    return add(value), add(lo), add(hi)


def _normed_input(x: Tensor, in_norm: NormSpec | None) -> tuple[Tensor, Tensor | None]:
    """The oracle's product input (float64) and the bound on the kernel's difference from it."""
    x64 = x.to(torch.float64)
    if in_norm is None:
        return x64, None
    h, lo, hi = rms_norm_oracle(x64, x64, x64, in_norm, x.dtype)
    return h, torch.maximum(hi - h, h - lo)


def linear_oracle(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, in_norm: NormSpec | None = None,
    residual: Tensor | None = None, out_norm: NormSpec | None = None, sums_exact: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(want, bound)``: ``residual + out_norm(round(in_norm(x) @ W^T + b))`` in float64, rounded where
    the kernel rounds, and the largest allowed ``|got - want|`` (module docstring), ``[..., N]``."""
    h, h_err = _normed_input(x, in_norm)
    y, delta = _sum_and_delta(h, h_err, weight, bias, sums_exact)
    if out_norm is None and residual is None and not sums_exact:
        return round_to(y, x.dtype), delta + ulp(y.abs() + delta, x.dtype)
    want, lo, hi = round_to(y, x.dtype), round_to(y - delta, x.dtype), round_to(y + delta, x.dtype)
    if out_norm is not None:
        want, lo, hi = rms_norm_oracle(want, lo, hi, out_norm, x.dtype)
    if residual is not None:
        want, lo, hi = residual_oracle(residual, want, lo, hi, x.dtype)
    return want, torch.maximum(hi - want, want - lo)


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


def gated_oracle(
    x: Tensor, weight: Tensor, act: str, *, in_norm: NormSpec | None = None, sums_exact: bool = False
) -> tuple[Tensor, Tensor]:
    """``(want, bound)`` for the gated MLP's first half, ``weight`` ``[2I, K]`` (gate rows, then up
    rows), of ``in_norm(x)`` when given."""
    h, h_err = _normed_input(x, in_norm)
    y, delta = _sum_and_delta(h, h_err, weight, None, sums_exact)
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
    "gamma",
    "gated_epilogue_oracle",
    "gated_oracle",
    "linear_oracle",
    "residual_oracle",
    "rms_norm_oracle",
    "round_to",
    "ulp",
    "violations",
]
