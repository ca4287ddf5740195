"""Low-precision recipes for infer_ref's model: the legitimate variants engines ship, and the recipe bugs.

A *recipe* is where a bfloat16/float16 engine rounds: which steps run in float32, in which order
the norm's products round, how attention's softmax accumulates. The canonical recipe is
transformers' (infer_ref's model computes it bit for bit). Engines legitimately differ from it
(:data:`LEGITIMATE`): eager attention, logits kept in float32, Llama's norm rounded after the
weight (the two orders of Llama's norm rounding: the canonical one rounds ``x * rstd`` first), a
float32 residual stream, fused residual-add + RMSNorm kernels (the norm reading the float32 sum;
the projection's product added unrounded and the sum rounded once), Gemma's embedding normaliser
kept in float32 (llama.cpp, on purpose), and stochastic rounding of every projection (a
Monte-Carlo-arithmetic stand-in for the accumulation orders of other kernels). Their spread is what
a correct engine may do.

The bugs (:data:`BUGS`) each round one quantity once in the wrong dtype, the way engines shipped
them: RMSNorm's mean square and rsqrt in the activation dtype, Gemma's ``1 + w`` in the weight
dtype, the embedding normaliser rounded to bfloat16 whatever the dtype, RoPE's inverse
frequencies rounded to the dtype, attention's softmax denominator accumulated in the dtype, a fused
add + norm that truncates the residual stream at every call (ROCm/aiter#5151), and RMSNorm's mean
square accumulated channel by channel in the dtype (sglang#27540).

Each recipe is a patch of one loaded model *instance* (nothing global changes), applied by
:func:`patched`; with no patch the model is infer_ref's own. ``python -m
infer_ref.conformance.engines.recipe_power`` measures each bug against the legitimate spread.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.attention import HeadTransform
from infer_ref.conformance.mutants import Knobs, _gemma_embed_unrounded, _patch_precision
from infer_ref.models.common import DecodeLinear, Normed, RMSNorm
from infer_ref.norm import rms_norm

ModelPatch = Callable[[Any], None]
_GEMMA, _PRE_NORM = ("gemma3_text",), ("llama", "qwen3")


@dataclass(frozen=True)
class Recipe:
    """A named recipe: ``patch`` changes a loaded model instance; ``families`` are the model types it
    applies to (empty: every one); ``dtypes`` those where it differs from the canonical recipe."""

    name: str
    doc: str
    patch: ModelPatch
    families: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("bfloat16", "float16")

    def applies_to(self, model_type: str, dtype: str) -> bool:
        return (not self.families or model_type in self.families) and dtype in self.dtypes


def patched(model: Any, recipe: Recipe) -> Any:
    """``model`` with ``recipe`` applied (in place) and returned."""
    recipe.patch(model)
    return model


# -- attention ------------------------------------------------------------------------------------


# (the attention module, q, k, v, its head transform, the step, the KV cache, the layer) -> its output:
# what an attention block's ``attend`` computes once its projections are made
Attend = Callable[[Any, Tensor, Tensor, Tensor, HeadTransform, Any, Any, int], Tensor]


def replace_attend(model: Any, attend: Attend) -> None:
    """Every attention block of the loaded ``model`` computes ``attend`` (bound to the block) in place
    of its own: nothing global is touched."""
    for block in model.layers:
        block.self_attn.attend = types.MethodType(attend, block.self_attn)


def with_attention(core: Callable[[Tensor, Tensor, Tensor, Tensor | None, float], Tensor]) -> ModelPatch:
    """A patch whose attention, after the head transform, is ``core(q, k, v, mask, scale)`` over the
    keys the layer holds (written through the cache first, as the model's own attention does; over
    the forward's own keys without one). ``q`` ``[B, H, T, D]``, ``k``/``v`` repeated to ``H`` heads."""

    def attend(
        self: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        transform: HeadTransform,
        step: Any,
        kv_cache: Any,
        layer_idx: int,
    ) -> Tensor:
        q, k = transform.apply(q, k)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)  # [B, Hkv, S, D]
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [B, H, S, D]
        return core(q, k, v, step.mask(layer_idx), self.scale)

    return lambda model: replace_attend(model, attend)


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``q k^T * scale`` in the activation dtype, masked keys at -inf: ``[B, H, T, S]`` (a mask
    ``[T, S]`` is shared by the batch, one ``[B, T, S]`` is per row)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~(mask[:, None] if mask.dim() == 3 else mask), float("-inf"))
    return scores


def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """transformers' eager attention: scores in the dtype, softmax in float32 cast back, then ``p v``."""
    wide = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for a float64 model
    return torch.matmul(torch.softmax(_scores(q, k, mask, scale), -1, dtype=wide).to(q.dtype), v)


def softmax_accumulated_low(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """The bug: softmax's exponentials and their sum in the activation dtype, the sum accumulated key
    by key (as a naive kernel's running sum): once it is large, small terms round away, the sum
    comes out low and every probability high."""
    scores = _scores(q, k, mask, scale)
    wide = torch.promote_types(q.dtype, torch.float32)
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row with every key masked
    exps = torch.exp((scores - top).to(wide)).to(q.dtype)  # [B, H, T, S]
    total = torch.zeros_like(exps[..., 0])
    for j in range(exps.shape[-1]):
        total = total + exps[..., j]  # rounded to the dtype at every step
    total = torch.where(total > 0, total, torch.ones_like(total)).to(wide)  # every key masked: output 0
    return torch.matmul((exps.to(wide) / total[..., None]).to(q.dtype), v)


# -- norms, embedding, logits, projections ------------------------------------------------------------


def _llama_norm_rounded_after_weight(self: Any, x: Tensor) -> Tensor:
    """``round(w * x * rstd)``: the weight applied in float32 before the one rounding (TransformerEngine)."""
    return (self.weight.float() * F.rms_norm(x.float(), self.weight.shape, eps=self.eps)).to(x.dtype)


def norm_rounded_after_weight(model: Any) -> None:
    for module in model.modules():
        if type(module) is RMSNorm:
            module.forward = types.MethodType(_llama_norm_rounded_after_weight, module)  # type: ignore[method-assign]


def logits_in_float32(model: Any) -> None:
    """The head's product in float32 (llama.cpp keeps its output f32)."""
    cap = model.config.final_logit_softcapping

    def logits(self: Any, x: Tensor) -> Tensor:
        out = F.linear(x.float(), self.lm_head.weight.float())
        return out if cap is None else torch.tanh(out / cap) * cap

    model.logits = types.MethodType(logits, model)


def _replace_modules(model: Any, kind: type, forward: Callable[..., Tensor]) -> None:
    """Every module of ``kind`` in the loaded ``model`` computes ``forward`` (bound to it)."""
    for module in model.modules():
        if isinstance(module, kind):
            module.forward = types.MethodType(forward, module)  # type: ignore[attr-defined]


def residual_in_float32(model: Any) -> None:
    """The residual stream kept in float32: each projection reads its input rounded to the weights'
    dtype, and the residual add happens in float32 (llama.cpp's f32 activations between kernels)."""

    def forward(self: Any, x: Any, *, residual: Tensor | None = None, out_norm: Any = None) -> Tensor:
        inp = x.evaluate() if isinstance(x, Normed) else x
        y = F.linear(inp.to(self.weight.dtype), self.weight, self.bias)
        if out_norm is not None:
            y = out_norm(y)
        return y if residual is None else residual.float() + y.float()

    _replace_modules(model, DecodeLinear, forward)


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # float32, or float64 for a float64 model


def _norm_of_wide(norm: RMSNorm, total: Tensor, dtype: torch.dtype) -> Tensor:
    """``norm`` of the unrounded ``total`` (float32), its output in ``dtype``: the module's own formula
    (Llama's rounds ``x * rstd`` before the weight; Gemma's forms everything wide and rounds last)."""
    if norm.unit_offset:
        return F.rms_norm(total, norm.weight.shape, 1.0 + norm.weight.to(total.dtype), norm.eps).to(dtype)
    return norm.weight * F.rms_norm(total, norm.weight.shape, eps=norm.eps).to(dtype)


def round_to_nearest(total: Tensor, dtype: torch.dtype) -> Tensor:
    return total.to(dtype)


def truncate_toward_zero(total: Tensor, dtype: torch.dtype) -> Tensor:
    """``total`` stored in ``dtype`` by dropping the bits it cannot hold: the neighbour nearer to 0,
    so every stored value's magnitude is at most the true one's (ROCm/aiter#5151)."""
    nearest = total.to(dtype)
    overshoot = nearest.to(total.dtype).abs() > total.abs()
    return torch.where(overshoot, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)


def fused_add_norm(
    store: Callable[[Tensor, torch.dtype], Tensor], *, product_wide: bool, norm_reads_wide_sum: bool
) -> ModelPatch:
    """A fused residual-add + RMSNorm kernel: each block's residual add is formed in float32 (with the
    projection's product unrounded when ``product_wide``, as a GEMM epilogue has it), stored in the
    activation dtype by ``store``, and the norm that reads the stream next normalises the float32
    sum itself when ``norm_reads_wide_sum`` (the kernel never re-reads what it stored), else the
    stored value."""

    def patch(model: Any) -> None:
        latest: list[tuple[Tensor, Tensor]] = []  # the last (stored sum, its float32 value)

        def forward(self: Any, x: Any, *, residual: Tensor | None = None, out_norm: Any = None) -> Tensor:
            inp = x.evaluate() if isinstance(x, Normed) else x
            wide = _wide(inp.dtype)
            if product_wide and out_norm is None:
                bias = None if self.bias is None else self.bias.to(wide)
                y = F.linear(inp.to(wide), self.weight.to(wide), bias)
            else:
                y = F.linear(inp, self.weight, self.bias)
                y = y if out_norm is None else out_norm(y)
            if residual is None:
                return y.to(inp.dtype)
            total = residual.to(wide) + y.to(wide)
            stored = store(total, residual.dtype)
            latest[:] = [(stored, total)]
            return stored

        def norm_forward(self: Any, x: Tensor) -> Tensor:
            if norm_reads_wide_sum and latest and x is latest[0][0]:
                return _norm_of_wide(self, latest[0][1], x.dtype)
            return rms_norm(x, self.weight, self.eps, unit_offset=self.unit_offset)  # the module's own

        _replace_modules(model, DecodeLinear, forward)
        _replace_modules(model, RMSNorm, norm_forward)  # Gemma's too: the stream's norms

    return patch


def _rms_variance_sequential_low(self: Any, x: Tensor) -> Tensor:
    """RMSNorm whose mean square is accumulated channel by channel in the activation dtype (each square
    and each partial sum rounded: once the sum is large the small squares round away), the rest as
    the module's formula computes it (sglang#27540)."""
    squares = x * x  # [..., E], rounded to the dtype
    total = squares[..., 0]
    for i in range(1, x.shape[-1]):
        total = total + squares[..., i]  # rounded at every step
    wide = _wide(x.dtype)
    rstd = torch.rsqrt(total.to(wide) / x.shape[-1] + self.eps)[..., None]
    if self.unit_offset:
        return (x.to(wide) * rstd * (1.0 + self.weight.to(wide))).to(x.dtype)
    return self.weight * (x.to(wide) * rstd).to(x.dtype)


def rms_variance_sequential_low(model: Any) -> None:
    _replace_modules(model, RMSNorm, _rms_variance_sequential_low)


def embed_normaliser_in_float32(model: Any) -> None:
    """Gemma's ``sqrt(hidden)`` kept in float32 (llama.cpp does so on purpose; transformers rounds it)."""
    model.embed = types.MethodType(_gemma_embed_unrounded, model)


def embed_normaliser_bf16(model: Any) -> None:
    """The bug: Gemma's ``sqrt(hidden)`` rounded to bfloat16 whatever the activation dtype (a cast
    written for bf16 checkpoints); in bfloat16 it is the canonical recipe."""

    def embed(self: Any, input_ids: Tensor) -> Tensor:
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(math.sqrt(self.config.hidden_size), dtype=torch.bfloat16).to(x.dtype)

    if model.config.model_type in _GEMMA:  # the others have no normaliser
        model.embed = types.MethodType(embed, model)


def stochastic_round(y: Tensor, dtype: torch.dtype, generator: torch.Generator) -> Tensor:
    """``y`` (float32) rounded to one of its two neighbours in ``dtype``, the upper one with probability
    its fraction of the gap: unbiased, the rounding of Monte-Carlo arithmetic."""
    nearest = y.to(dtype)
    up = nearest.float() < y
    other = torch.nextafter(nearest, torch.where(up, torch.inf, -torch.inf).to(dtype))
    lo = torch.where(up, nearest, other).float()
    hi = torch.where(up, other, nearest).float()
    gap = hi - lo
    frac = torch.where(gap > 0, (y - lo) / torch.where(gap > 0, gap, 1.0), 0.0)
    draw = torch.rand(y.shape, generator=generator, dtype=torch.float32)
    return torch.where(draw < frac, hi, lo).to(dtype)


def stochastic_rounding(seed: int) -> ModelPatch:
    """Every projection's product in float32, stochastically rounded to the dtype (``seed``)."""

    def patch(model: Any) -> None:
        generator = torch.Generator().manual_seed(seed)

        def forward(self: Any, x: Any, *, residual: Tensor | None = None, out_norm: Any = None) -> Tensor:
            inp = x.evaluate() if isinstance(x, Normed) else x
            bias = None if self.bias is None else self.bias.float()
            y = stochastic_round(F.linear(inp.float(), self.weight.float(), bias), inp.dtype, generator)
            if out_norm is not None:
                y = out_norm(y)
            return y if residual is None else residual + y

        _replace_modules(model, DecodeLinear, forward)

    return patch


def _knobs(knobs: Knobs) -> ModelPatch:
    return lambda model: _patch_precision(model, knobs)


def _none(model: Any) -> None:
    """The canonical recipe: infer_ref's model as it is."""


LEGITIMATE: tuple[Recipe, ...] = (
    Recipe("canonical", "transformers' recipe (infer_ref's model; SDPA attention)", _none),
    Recipe(
        "eager_attention",
        "scores in the dtype, softmax in float32 cast back",
        with_attention(eager_attention),
    ),
    Recipe("logits_float32", "the head's product and the logits in float32", logits_in_float32),
    Recipe(
        "norm_rounded_after_weight",
        "Llama/Qwen RMSNorm rounded once, after the weight",
        norm_rounded_after_weight,
        families=_PRE_NORM,
    ),
    Recipe(
        "residual_float32", "the residual stream in float32, projections read it rounded", residual_in_float32
    ),
    Recipe(
        "embed_normaliser_float32",
        "Gemma's sqrt(hidden) kept in float32 (llama.cpp)",
        embed_normaliser_in_float32,
        families=_GEMMA,
    ),
    Recipe(
        "fused_add_norm_float32",
        "fused residual add + RMSNorm: the norm reads the float32 sum, the stream stores it rounded",
        fused_add_norm(round_to_nearest, product_wide=False, norm_reads_wide_sum=True),
    ),
    Recipe(
        "fused_add_rounded_once",
        "the projection's float32 product added to the residual and rounded once (a GEMM epilogue)",
        fused_add_norm(round_to_nearest, product_wide=True, norm_reads_wide_sum=False),
    ),
    *(
        Recipe(
            f"stochastic_rounding_{seed}",
            f"every projection stochastically rounded (seed {seed})",
            stochastic_rounding(seed),
        )
        for seed in (1, 2, 3)
    ),
)
"""Recipes a correct engine may use: their spread calibrates the signed statistics."""

BUGS: tuple[Recipe, ...] = (
    Recipe(
        "rms_norm_low_precision",
        "RMSNorm's mean square, rsqrt and scaling in the activation dtype",
        _knobs(Knobs(norm_precision="low_accumulate")),
    ),
    Recipe(
        "gemma_one_plus_w_low_precision",
        "Gemma's 1 + w added in the weight dtype",
        _knobs(Knobs(norm_precision="gemma_one_plus_w_low")),
        families=_GEMMA,
    ),
    Recipe(
        "embed_normaliser_bf16",
        "Gemma's sqrt(hidden) rounded to bfloat16 whatever the dtype",
        embed_normaliser_bf16,
        families=_GEMMA,
        dtypes=("float16",),
    ),
    Recipe(
        "rope_inv_freq_low_precision",
        "RoPE inverse frequencies rounded to the dtype",
        _knobs(Knobs(rope_precision="inv_freq_low")),
    ),
    Recipe(
        "softmax_sum_low_precision",
        "attention's softmax denominator accumulated key by key in the dtype",
        with_attention(softmax_accumulated_low),
    ),
    Recipe(
        "fused_add_norm_truncated",
        "fused residual add + RMSNorm storing the stream truncated toward zero at every call",
        fused_add_norm(truncate_toward_zero, product_wide=False, norm_reads_wide_sum=True),
    ),
    Recipe(
        "rms_variance_sequential_low_precision",
        "RMSNorm's mean square accumulated channel by channel in the activation dtype",
        rms_variance_sequential_low,
    ),
)
"""Recipe bugs: each rounds one quantity in the wrong dtype."""
