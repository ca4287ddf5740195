"""The kit's bug classes planted inside infer_ref's Engine, for measuring what the engine tier
catches in each dtype (``python -m infer_ref.conformance.engines.power``).

The kit plants these bugs in a model or a cache it drives itself (:mod:`infer_ref.conformance.mutants`);
an engine team meets them inside an engine, behind batching, paging and prefix caching. Each
mutant here is infer_ref's Engine with one of them, planted where an engine has it:

- in the **model** (RoPE, attention scale, QK-norm, the low-precision norm and RoPE steps, and the
  recipe errors of :mod:`~infer_ref.conformance.engines.recipes`: the softmax sum accumulated in the
  dtype, Gemma's normaliser rounded in bfloat16): the loaded model instance gets the kit's knobbed
  method (:func:`~infer_ref.conformance.mutants._patch_precision` and friends) or the recipe's
  patch, nothing global is touched;
- in the **cache view** each engine forward sees (masks, windows, slots): a
  :class:`~infer_ref.cache.paged.PagedKVCache` subclass set as the Engine's ``cache_class``.

Bugs of the schedule and of the API layer (prefix reuse, preemption, sampler seeds, logprob
bookkeeping) are :mod:`~infer_ref.conformance.engines.mutants`'s, planted the same way
(:class:`~infer_ref.conformance.engines.mutants.PlantedBug`).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from infer_ref.attention import HeadTransform, cached_attention
from infer_ref.cache.paged import PagedKVCache
from infer_ref.conformance.engines.adapters.infer_ref_engine import InferRefEngine
from infer_ref.conformance.engines.mutants import RECIPE_BUG_CLASSES, ModelPatch, PlantedBug, planted_factory
from infer_ref.conformance.engines.recipes import (
    embed_normaliser_bf16,
    fused_add_norm,
    replace_attend,
    rms_variance_sequential_low,
    softmax_accumulated_low,
    truncate_toward_zero,
    with_attention,
)
from infer_ref.conformance.engines.verdicts.tolerances import LOW_PRECISION
from infer_ref.conformance.mutants import (
    BUG_CLASSES,
    EXTRA_BUG_CLASSES,
    Knobs,
    _gemma_embed_unrounded,
    _patch_precision,
    _strip_llama3,
)
from infer_ref.conformance.mutants.broken import mask_top_left_aligned
from infer_ref.conformance.mutants.caches import CACHE_BUG_CLASSES, DecodeSlotOffByOnePagedCache
from infer_ref.conformance.mutants.engine import ChunkOverCacheView
from infer_ref.models.common import apply_rope

# -- the model -----------------------------------------------------------------------------------


def rope_restarts_each_forward(model: Any) -> None:
    """RoPE positions counted from the forward's first token: every decode token at position 0,
    a prefill after a prefix hit from 0 again (``rope_no_offset``)."""
    for rotary in model.rotary.values():
        forward = rotary.forward
        rotary.forward = lambda positions, dtype, forward=forward: forward(
            positions - positions[..., :1], dtype
        )


def scale_from_head_dim(model: Any) -> None:
    """Attention scale ``head_dim ** -0.5`` instead of ``query_pre_attn_scalar ** -0.5`` (Gemma)."""
    for block in model.layers:
        block.self_attn.scale = block.self_attn.head_dim**-0.5


def _attend_with(
    transform_qkv: Callable[[Any, Tensor, Tensor, Tensor, HeadTransform], tuple[Tensor, Tensor, Tensor]],
) -> ModelPatch:
    """A patch replacing each attention's ``attend`` by one whose head transform is ``transform_qkv``."""

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
        q, k, v = transform_qkv(self, q, k, v, transform)
        return cached_attention(kv_cache, layer_idx, q, k, v, step.mask(layer_idx), self.scale)

    return lambda model: replace_attend(model, attend)


def _v_rotated(
    attn: Any, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform
) -> tuple[Tensor, Tensor, Tensor]:
    q, k = transform.apply(q, k)
    return q, k, apply_rope(v, transform.cos, transform.sin)


def _qk_norm_after_rope(
    attn: Any, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform
) -> tuple[Tensor, Tensor, Tensor]:
    q, k = HeadTransform(transform.cos, transform.sin).apply(q, k)
    if transform.q_norm is not None and transform.k_norm is not None:
        q, k = transform.q_norm(q), transform.k_norm(k)
    return q, k, v


def _qk_norm_missing(
    attn: Any, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform
) -> tuple[Tensor, Tensor, Tensor]:
    q, k = HeadTransform(transform.cos, transform.sin).apply(q, k)
    return q, k, v


def embed_scale_unrounded(model: Any) -> None:
    if model.config.model_type == "gemma3_text":
        model.embed = types.MethodType(_gemma_embed_unrounded, model)


def llama3_scaling_ignored(model: Any) -> None:
    for rotary in model.rotary.values():
        rotary.rope = _strip_llama3(rotary.rope)
        rotary.reset_buffers(rotary.inv_freq.device)


def _precision(knobs: Knobs) -> ModelPatch:
    return lambda model: _patch_precision(model, knobs)


# -- the cache view ------------------------------------------------------------------------------


class WindowOffByOneView(PagedKVCache):
    """Sliding layers see window + 1 keys (``>=`` for ``>``)."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        return super().attention_mask(t, None if window is None else window + 1)


class DecodeWindowMissingView(PagedKVCache):
    """A single new token gets no window ("one token sees everything")."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        return super().attention_mask(t, None if t == 1 else window)


class TopLeftMaskView(ChunkOverCacheView):
    """Several new tokens over cached ones (a chunk, a prefill after a prefix hit) masked
    ``ones(T, S).tril()``: query i sees keys 0..i as if nothing were cached (the kit's mask)."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        if not self._is_chunk_over_cache(t):
            return super().attention_mask(t, window)
        return mask_top_left_aligned(t, self.position.lengths[0], window, self.device)


class PaddedTailView(PagedKVCache):
    """In a batch of rows of different lengths, shorter rows also see the padded slots after their
    end (gathered from whatever block the padding points at)."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        mask = super().attention_mask(t, window)
        if mask is None or mask.dim() != 3:
            return mask
        row_end = self.positions(t)[:, -1:]  # [B, 1], each row's last new position
        past_end = torch.arange(mask.shape[-1], device=self.device)[None, :] > row_end  # [B, S]
        return mask | past_end[:, None, :]


class GlobalFromSlidingView(PagedKVCache):
    """Every layer's keys as a window's: a global layer sees only the sliding window's keys
    (one layer's window applied to all)."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        return super().attention_mask(t, window if window is not None else self._first_window())

    def _first_window(self) -> int | None:
        return next((w for w in self.layer_windows or () if w is not None), None)


# -- the mutants ---------------------------------------------------------------------------------

IN_FLOAT32_CANONICAL = "in float32 the model dtype is float32: the planted change is the canonical recipe"

KIT_BUG_MUTANTS = (
    PlantedBug(
        "engine_rope_no_offset",
        BUG_CLASSES[0],
        doc="RoPE positions restart at 0 on every forward.",
        model_patch=rope_restarts_each_forward,
    ),
    PlantedBug(
        "engine_decode_window_missing",
        BUG_CLASSES[1],
        doc="A decode token sees past its sliding window.",
        cache_class=DecodeWindowMissingView,
    ),
    PlantedBug(
        "engine_window_off_by_one",
        BUG_CLASSES[2],
        doc="Sliding layers see window + 1 keys.",
        cache_class=WindowOffByOneView,
    ),
    PlantedBug(
        "engine_sliding_window_everywhere",
        BUG_CLASSES[3],
        doc="Global layers masked with the sliding window.",
        cache_class=GlobalFromSlidingView,
    ),
    PlantedBug(
        "engine_mask_top_left",
        BUG_CLASSES[5],
        doc="A prefill over a prefix hit masked as if nothing were cached.",
        cache_class=TopLeftMaskView,
    ),
    PlantedBug(
        "engine_padded_tail_attended",
        BUG_CLASSES[6],
        doc="Batched rows see the padded slots past their end.",
        cache_class=PaddedTailView,
    ),
    PlantedBug(
        "engine_decode_slot_off_by_one",
        CACHE_BUG_CLASSES[2],
        doc="Each decode token's K/V written at its predecessor's slot.",
        cache_class=DecodeSlotOffByOnePagedCache,
    ),
    PlantedBug(
        "engine_v_rotated",
        BUG_CLASSES[9],
        doc="RoPE applied to V as well.",
        model_patch=_attend_with(_v_rotated),
    ),
    PlantedBug(
        "engine_qk_norm_after_rope",
        BUG_CLASSES[10],
        doc="QK-norm applied after RoPE (Qwen 3, Gemma 3).",
        model_patch=_attend_with(_qk_norm_after_rope),
    ),
    PlantedBug(
        "engine_qk_norm_missing",
        BUG_CLASSES[10],
        doc="QK-norm weights never applied (Qwen 3, Gemma 3).",
        model_patch=_attend_with(_qk_norm_missing),
    ),
    PlantedBug(
        "engine_scale_from_head_dim",
        BUG_CLASSES[11],
        doc="Attention scale from head_dim, not query_pre_attn_scalar (Gemma 3).",
        model_patch=scale_from_head_dim,
    ),
    PlantedBug(
        "engine_embed_scale_unrounded",
        BUG_CLASSES[12],
        doc="Gemma's embedding scale not rounded to the dtype.",
        model_patch=embed_scale_unrounded,
        bug_in=(),
        no_bug_because=(
            "the engine tier takes Gemma's normaliser kept in float32 for a legitimate recipe in every dtype "
            "(llama.cpp's on purpose, in the calibration ensemble; an engine declares it); in float32 it "
            "changes nothing. The kit's model tests hold an implementation to transformers' rounding"
        ),
    ),
    PlantedBug(
        "engine_llama3_scaling_ignored",
        BUG_CLASSES[13],
        doc="Llama 3 RoPE scaling dropped.",
        model_patch=llama3_scaling_ignored,
    ),
    PlantedBug(
        "engine_rms_norm_low_precision",
        EXTRA_BUG_CLASSES[0],
        doc="RMSNorm accumulated and scaled in the model dtype.",
        model_patch=_precision(Knobs(norm_precision="low_accumulate")),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_gemma_one_plus_w_low_precision",
        EXTRA_BUG_CLASSES[1],
        doc="Gemma's 1 + w formed in the weight dtype.",
        model_patch=_precision(Knobs(norm_precision="gemma_one_plus_w_low")),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_rope_angles_low_precision",
        EXTRA_BUG_CLASSES[2],
        doc="RoPE angles formed in the model dtype.",
        model_patch=_precision(Knobs(rope_precision="angles_low")),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_rope_inv_freq_low_precision",
        EXTRA_BUG_CLASSES[2],
        doc="RoPE inverse frequencies rounded to the model dtype.",
        model_patch=_precision(Knobs(rope_precision="inv_freq_low")),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_softmax_sum_low_precision",
        RECIPE_BUG_CLASSES[0],
        doc="Attention's softmax sum accumulated key by key in the model dtype.",
        model_patch=with_attention(softmax_accumulated_low),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_embed_normaliser_bf16",
        BUG_CLASSES[12],
        doc="Gemma's embedding normaliser rounded to bfloat16 whatever the dtype.",
        model_patch=embed_normaliser_bf16,
        bug_in=("float32", "float16"),
        no_bug_because="in bfloat16 the normaliser rounded to bfloat16 is the canonical recipe",
    ),
    PlantedBug(
        "engine_rms_variance_sequential_low_precision",
        EXTRA_BUG_CLASSES[0],
        doc="RMSNorm's mean square accumulated channel by channel in the model dtype.",
        model_patch=rms_variance_sequential_low,
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
    PlantedBug(
        "engine_fused_add_norm_truncated",
        RECIPE_BUG_CLASSES[1],
        doc="A fused residual add + RMSNorm storing the stream truncated toward zero at every call.",
        model_patch=fused_add_norm(truncate_toward_zero, product_wide=False, norm_reads_wide_sum=True),
        bug_in=LOW_PRECISION,
        no_bug_because=IN_FLOAT32_CANONICAL,
    ),
)


def __getattr__(
    name: str,
) -> Callable[..., InferRefEngine]:  # --engine infer_ref.conformance.engines.kit_bugs:NAME
    return planted_factory(__name__, name, KIT_BUG_MUTANTS)


__all__ = ["KIT_BUG_MUTANTS"]
