"""Stated arithmetic: expected values computed from the definitions, without the code under test.

Three kinds of oracle, in the order docs/design.md ranks them:

* **transformers** on the same weights, in float64: the model-level truth
  (:mod:`~infer_ref.conformance.oracles.transformers_fp64`).
* **stated arithmetic** in float64 (this module: ``visible_keys``, ``naive_attention``,
  ``llama3_inv_freq``, ``rotate_pairs``, the low-precision definitions): the definitions written out
  with loops and explicit formulas, sharing no code with ``infer_ref.models``.
* **full recompute** is done by the tests themselves (the implementation's own uncached forward).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from infer_ref.config import RopeConfig


def visible_keys(q_len: int, start: int, window: int | None) -> Tensor:
    """Bool ``[q_len, start+q_len]`` by the definition: query ``i`` sits at ``p = start+i`` and sees
    key ``j`` iff ``j <= p`` and, with a window, ``p - window < j`` (distance ``0 .. window-1``)."""
    kv_len = start + q_len
    out = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for i in range(q_len):
        p = start + i
        for j in range(kv_len):
            out[i, j] = j <= p and (window is None or p - j < window)
    return out


def mask_as_visibility(mask: Tensor | None, q_len: int, start: int) -> Tensor:
    """An implementation's mask as an explicit bool ``[q_len, start+q_len]`` (None: all visible)."""
    if mask is None:
        return torch.ones(q_len, start + q_len, dtype=torch.bool)
    return mask.to(device="cpu", dtype=torch.bool)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float) -> Tensor:
    """Float64 attention with GQA by index: query head ``h`` reads kv head ``h // (H / Hkv)``.

    q ``[B, H, T, D]``, k/v ``[B, Hkv, S, D]``, visible bool ``[T, S]`` -> ``[B, H, T, D]``.
    """
    q, k, v = q.double(), k.double(), v.double()
    b, h, t, d = q.shape
    groups = h // k.shape[1]
    out = torch.empty(b, h, t, d, dtype=torch.float64)
    for head in range(h):
        kh, vh = k[:, head // groups], v[:, head // groups]  # [B, S, D]
        scores = torch.einsum("btd,bsd->bts", q[:, head], kh) * scale  # [B, T, S]
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[:, head] = torch.einsum("bts,bsd->btd", torch.softmax(scores, dim=-1), vh)
    return out


def llama3_inv_freq(head_dim: int, rope: RopeConfig, *, base_in_float32: bool = True) -> list[float]:
    """Llama 3.1 frequency scaling, from its definition, in Python floats (float64).

    wavelength ``w = 2π / f``; ``w < orig / high``: keep ``f``; ``w > orig / low``: ``f / factor``;
    between: ``(1 - s) f / factor + s f`` with ``s = (orig / w - low) / (high - low)``.
    The base frequencies ``f = theta ** (-2i / D)`` are rounded to float32 first, as every
    implementation that matches transformers computes them (``base_in_float32=False``: kept in
    float64, the float64 definition).
    """
    assert rope.original_max_position_embeddings is not None
    orig = rope.original_max_position_embeddings
    out = []
    for i in range(0, head_dim, 2):
        f = 1.0 / (rope.theta ** (i / head_dim))
        if base_in_float32:
            f = float(torch.tensor(f, dtype=torch.float32))
        w = 2 * math.pi / f
        if w < orig / rope.high_freq_factor:
            out.append(f)
        elif w > orig / rope.low_freq_factor:
            out.append(f / rope.factor)
        else:
            s = (orig / w - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
            out.append((1 - s) * f / rope.factor + s * f)
    return out


def llama3_band(head_dim: int, rope: RopeConfig) -> list[str]:
    """Which band each frequency falls in: 'keep', 'smooth' or 'divide'."""
    assert rope.original_max_position_embeddings is not None
    orig = rope.original_max_position_embeddings
    bands = []
    for i in range(0, head_dim, 2):
        w = 2 * math.pi * rope.theta ** (i / head_dim)
        bands.append("keep" if w < orig / rope.high_freq_factor else "divide" if w > orig / rope.low_freq_factor else "smooth")
    return bands


def inv_freq_float64(head_dim: int, rope: RopeConfig) -> Tensor:
    """The inverse frequencies ``[D/2]`` by their definition in float64, nothing rounded to float32:
    ``theta ** (-2i / D)``, divided by ``factor`` (linear), or scaled by :func:`llama3_inv_freq`."""
    if rope.rope_type == "llama3":
        return torch.tensor(llama3_inv_freq(head_dim, rope, base_in_float32=False), dtype=torch.float64)
    freqs = [1.0 / rope.theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    if rope.rope_type == "linear":
        freqs = [f / rope.factor for f in freqs]
    return torch.tensor(freqs, dtype=torch.float64)


def rotate_pairs(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """RoPE by definition in float64: dims ``i`` and ``i + D/2`` rotated by ``pos * inv_freq[i]``.

    x ``[..., T, D]``, positions ``[T]``, inv_freq ``[D/2]``.
    """
    x = x.double()
    half = x.shape[-1] // 2
    angle = positions.double()[:, None] * inv_freq.double()[None, :]  # [T, D/2]
    c, s = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


# -- low-precision definitions -------------------------------------------------------------------


def rms_norm_definition(x: Tensor, weight: Tensor, eps: float, gemma: bool) -> Tensor:
    """RMSNorm in ``x``'s dtype by its definition (transformers' ``LlamaRMSNorm`` / ``Gemma3RMSNorm``).

    ``r = x_fp32 * rsqrt(mean(x_fp32²) + eps)``; Llama/Qwen: ``w * dtype(r)`` (the product rounded to
    the dtype); Gemma: ``dtype(r * (1 + w_fp32))`` (one rounding, ``1 + w`` formed in fp32).
    ``weight`` is the weight as loaded (already in the model dtype).
    """
    return rms_norm_scaled(rms_normalised(x, eps), weight, x.dtype, gemma)


def rms_normalised(x: Tensor, eps: float) -> Tensor:
    """``r = x_fp32 * rsqrt(mean(x_fp32²) + eps)`` in fp32, the mean summed in torch's order."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_scaled(r: Tensor, weight: Tensor, dtype: torch.dtype, gemma: bool) -> Tensor:
    """The definition's last step from the fp32 normalised ``r``: ``w * dtype(r)`` (Llama/Qwen) or
    ``dtype(r * (1 + w_fp32))`` (Gemma)."""
    if gemma:
        return (r * (1.0 + weight.float())).to(dtype)
    return weight * r.to(dtype)


def rms_norm_one_flip(x: Tensor, weight: Tensor, eps: float, gemma: bool) -> tuple[Tensor, Tensor]:
    """The definition with its one low-precision rounding flipped by one ulp, down and up: what
    another fp32 summation order (or rsqrt) may give, as the values the definition's rounding could
    have produced. Gemma: the single rounding ``dtype(r * (1 + w))``, one ulp either way. Llama/Qwen:
    ``dtype(r)`` one ulp either way, then the product with ``w`` rounded as the definition rounds it
    (one ulp of ``dtype(r)`` times |w| is up to three ulps of the rounded product)."""
    r = rms_normalised(x, eps)
    if gemma:
        return _next_ulps(rms_norm_scaled(r, weight, x.dtype, gemma=True))
    below, above = _next_ulps(r.to(x.dtype))
    return weight * below, weight * above


def _next_ulps(t: Tensor) -> tuple[Tensor, Tensor]:
    """The representable values of ``t``'s dtype just below and just above each element."""
    return torch.nextafter(t, torch.full_like(t, -math.inf)), torch.nextafter(t, torch.full_like(t, math.inf))


def rope_tables_definition(inv_freq_fp32: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin ``[T, D]`` as transformers builds them: the angle ``fp32(position * inv_freq)`` (one
    fp32 rounding of an exact product), cos/sin of that angle (here in float64), rounded to ``dtype``."""
    angle = (positions.double()[:, None] * inv_freq_fp32.double()[None, :]).float().double()  # [T, D/2]
    emb = torch.cat((angle, angle), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def default_inv_freq(head_dim: int, rope: RopeConfig) -> Tensor:
    """``theta ** (-2i / D)`` rounded to fp32 (linear scaling divides by its factor), from the formula
    in float64; llama3 scaling through :func:`llama3_inv_freq`."""
    if rope.rope_type == "llama3":
        return torch.tensor(llama3_inv_freq(head_dim, rope), dtype=torch.float64).float()
    return inv_freq_float64(head_dim, rope).float()


def ulps_apart(actual: Tensor, expected: Tensor) -> Tensor:
    """How many representable values of ``expected``'s dtype lie between the two (elementwise)."""
    dtype = expected.dtype
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]

    def ordered(t: Tensor) -> Tensor:
        i = t.to(dtype).contiguous().view(bits).long()
        return torch.where(i < 0, -(i & (2 ** (8 * t.to(dtype).element_size() - 1) - 1)), i)

    return (ordered(actual) - ordered(expected)).abs()
