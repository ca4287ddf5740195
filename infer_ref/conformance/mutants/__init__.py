"""Planted bugs: deliberately broken implementations, one or more per bug class of docs/design.md.

Each mutant is a complete :class:`~infer_ref.conformance.interface.adapter.Adapter`, selectable like any other
implementation (``pytest --ir-impl=infer_ref.conformance.mutants:rope_no_offset``), and each plants
one bug the way it has shipped in real engines. The suite is only trusted if it fails on every one
of them: ``python -m infer_ref.conformance.mutants`` runs it against all mutants and prints which tests
caught each. The low-precision, sampling and stopping families (``EXTRA_BUG_CLASSES``) have
mutants too: norms and RoPE patched on the instance, and knobbed copies of the sampler and of the
greedy loop's stopping rule.

Nothing global is patched. A mutant's models are ordinary infer_ref models whose *instances* get a
replacement ``forward`` / ``embed`` / attention ``forward`` (:func:`_patch_model`), copies of the
real code with one switch (:class:`Knobs`) flipped; its caches are subclasses of ``KVCache``. With
every switch at its default the copies produce the real model's logits bit for bit (checked by
``tests/kit/test_kit.py``), so a mutant differs from infer_ref by exactly its planted bug.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from infer_ref.attention import grouped_query_attention
from infer_ref.config import RopeConfig
from infer_ref.conformance.adapters import reference as ref
from infer_ref.conformance.interface.adapter import Adapter, CacheSpec, SamplerSpec
from infer_ref.conformance.mutants import caches
from infer_ref.conformance.mutants.broken import (
    ClampingCache,
    FullBufferCache,
    NoRestartCache,
    aliased_cache,
    mask_no_window_on_decode,
    mask_top_left_aligned,
    mask_window_off_by_one,
)
from infer_ref.conformance.mutants.caches import CACHE_BUG_CLASSES
from infer_ref.conformance.mutants.engine import CHUNK_BUG_CLASSES, CHUNK_ENGINES, SCHEDULE_BUG_CLASSES, SCHEDULE_ENGINES
from infer_ref.conformance.mutants.knobs import Knobs
from infer_ref.conformance.mutants.prefix import PREFIX_BUG_CLASSES, PREFIX_MANAGERS, prefix_adapter
from infer_ref.conformance.mutants.sampling import _generate_stopping, _sample_draws, _warp_logits
from infer_ref.engine.block_manager import BlockManager
from infer_ref.models.common import (
    SDPA_BACKENDS,
    GemmaRMSNorm,
    Normed,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
)
from infer_ref.step import Step

# The bug classes of docs/design.md, verbatim.
BUG_CLASSES = (
    "RoPE position not offset by the cache length",
    "sliding-window mask missing on decode",
    "window off-by-one",
    "one layer's window applied to all layers",
    "global length read from a sliding layer",
    "causal mask top-left aligned for T>1 over a cache",
    "unwritten cache slots attended",
    "cache not reset between requests",
    "advance skipped or doubled",
    "V rotated by RoPE",
    "QK-norm after RoPE or missing",
    "wrong attention scale (query_pre_attn_scalar)",
    "embed scale not rounded to dtype",
    "llama3 rope scaling ignored",
    "layers aliasing one cache slice",
    "overflow clamped silently",
)

# Bug classes beyond docs/design.md's list: the low-precision, sampling and stopping families, which a
# float64 suite cannot see.
EXTRA_BUG_CLASSES = (
    "RMSNorm accumulated or scaled in low precision",
    "Gemma's 1 + w formed in low precision",
    "RoPE frequencies or angles held in low precision",
    "sampling warpers in the wrong order",
    "top-k / top-p support not transformers'",
    "sampled draws not from the filtered distribution",
    "EOS ignored or only partly honoured",
    "one token too many or too few",
    "stop strings across token boundaries or out of order",
)

def _mask_for(knobs: Knobs, q_len: int, start: int, window: int | None, device: torch.device | str, kv_cache: Any) -> Tensor | None:
    mask = knobs.mask(q_len, start, window, device)
    if knobs.pad_mask_to_capacity and kv_cache is not None and mask is not None:
        mask = F.pad(mask, (0, kv_cache.max_seq_len - mask.shape[-1]), value=True)  # [T, max_seq_len]
    return mask


def _decoder_forward(self: Any, input_ids: Tensor, kv_cache: Any = None, *, all_logits: bool = False, knobs: Knobs) -> Tensor:
    """Copy of ``DecoderLM.forward`` with the knobs."""
    config = self.config
    t = self._check_inputs(input_ids, kv_cache)
    start = 0 if kv_cache is None else kv_cache.seq_len
    rope_start = start if knobs.rope_offset else 0
    if knobs.rope_offset_from_sliding_layer and config.is_sliding(0):
        rope_start = min(start, config.sliding_window)
    positions = torch.arange(rope_start, rope_start + t, device=input_ids.device)
    window_types = [config.layer_types[0] if knobs.first_layer_window_everywhere else lt for lt in config.layer_types]
    step = Step(
        t, positions, tuple(self._window(lt) for lt in window_types),
        lambda window: _mask_for(knobs, t, start, window, input_ids.device, kv_cache),
    )  # fmt: skip
    x = self.embed(input_ids)  # [B, T, E]
    tables = {lt: rotary(positions, x.dtype) for lt, rotary in self.rotary.items()}
    with sdpa_kernel(SDPA_BACKENDS, set_priority=True):
        for i, block in enumerate(self.layers):
            cos, sin = tables[config.layer_types[i]]
            x = block(x, cos, sin, step, kv_cache, i)
    if kv_cache is not None:
        if knobs.advance == "once" or (knobs.advance == "skip_decode" and t > 1):
            kv_cache.advance(t)
        elif knobs.advance == "twice":
            kv_cache.advance(t)
            kv_cache.advance(t)
        if not all_logits:
            x = x[:, -1:, :]
    return self.logits(self.norm(x))


def _attention_forward(
    self: Any,
    x: Any,
    cos: Tensor,
    sin: Tensor,
    step: Step,
    kv_cache: Any = None,
    layer_idx: int = 0,
    *,
    residual: Tensor | None = None,
    out_norm: Any = None,
    knobs: Knobs,
) -> Tensor:
    """Copy of ``Attention.forward`` with the knobs (the head transform written out, so the knobs
    can reorder it; the cache written through ``update``)."""
    b, t, _ = (x.x if isinstance(x, Normed) else x).shape
    q, k, v = self.qkv_proj.split(self.qkv_proj(x))
    q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
    k = k.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
    v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
    has_norm = self.q_norm is not None and self.k_norm is not None
    if has_norm and knobs.qk_norm == "before_rope":
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if knobs.v_rotated:
        v = apply_rope(v, cos, sin)
    if has_norm and knobs.qk_norm == "after_rope":
        q, k = self.q_norm(q), self.k_norm(k)
    if kv_cache is not None:
        k, v = kv_cache.update(layer_idx, k, v)
    scale = self.head_dim**-0.5 if knobs.scale_from_head_dim else self.scale
    out = grouped_query_attention(q, k, v, step.mask(layer_idx), scale)
    return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim), residual=residual, out_norm=out_norm)


def _gemma_embed_unrounded(self: Any, input_ids: Tensor) -> Tensor:
    return self.embed_tokens(input_ids) * self.config.hidden_size**0.5  # 33.94..., not bf16's 34.0


def _strip_llama3(rope: RopeConfig) -> RopeConfig:
    return RopeConfig(theta=rope.theta) if rope.rope_type == "llama3" else rope


def _rms_norm_low_accumulate(self: Any, x: Tensor) -> Tensor:
    """Mean of squares, rsqrt and scaling all in the activation dtype (no fp32 upcast)."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    weight = 1.0 + self.weight if isinstance(self, GemmaRMSNorm) else self.weight
    return weight * h


def _gemma_norm_one_plus_w_low(self: Any, x: Tensor) -> Tensor:
    """``1 + w`` added in the weight dtype (bf16 rounds it to 2^-6..2^-7), the rest in fp32."""
    return F.rms_norm(x.float(), self.weight.shape, (1.0 + self.weight).float(), self.eps).type_as(x)


def _rope_angles_low(self: Any, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``position * inv_freq`` formed in the activation dtype: the angle error grows with the position."""
    freqs = positions[:, None].to(dtype) * self.inv_freq[None, :].to(dtype)  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1).float()
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _patch_precision(model: Any, knobs: Knobs) -> None:
    if knobs.norm_precision != "fp32":
        patched = _rms_norm_low_accumulate if knobs.norm_precision == "low_accumulate" else _gemma_norm_one_plus_w_low
        for module in model.modules():
            if isinstance(module, GemmaRMSNorm) or (isinstance(module, RMSNorm) and knobs.norm_precision == "low_accumulate"):
                module.forward = types.MethodType(patched, module)  # type: ignore[method-assign]
    for rotary in model.rotary.values():
        if knobs.rope_precision == "angles_low":
            rotary.forward = types.MethodType(_rope_angles_low, rotary)
        elif knobs.rope_precision == "inv_freq_low":
            # A registered buffer that ``model.to(dtype)`` rounded: the fp32 forward reads rounded values.
            rotary.inv_freq = rotary.inv_freq.to(model.embed_tokens.weight.dtype)


def _patch_model(model: Any, knobs: Knobs) -> Any:
    """Give this model instance the knobbed forward methods (nothing global is touched)."""
    model.forward = types.MethodType(lambda self, ids, kv_cache=None, *, all_logits=False: _decoder_forward(
        self, ids, kv_cache, all_logits=all_logits, knobs=knobs
    ), model)
    for block in model.layers:
        attn = block.self_attn
        attn.forward = types.MethodType(
            lambda self, x, cos, sin, step, kv_cache=None, layer_idx=0, *, residual=None, out_norm=None: _attention_forward(
                self, x, cos, sin, step, kv_cache, layer_idx, residual=residual, out_norm=out_norm, knobs=knobs
            ),
            attn,
        )
    if knobs.embed_scale_unrounded and model.config.model_type == "gemma3_text":
        model.embed = types.MethodType(_gemma_embed_unrounded, model)
    if knobs.llama3_ignored:
        for rotary in model.rotary.values():
            rotary.rope = _strip_llama3(rotary.rope)
            rotary.reset_buffers(rotary.inv_freq.device)
    _patch_precision(model, knobs)
    return model


def make_adapter(name: str, knobs: Knobs, description: str = "") -> Adapter:
    """An Adapter over infer_ref whose every path goes through ``knobs``."""

    def make_cache(spec: CacheSpec) -> Any:
        if knobs.cache_factory is not None:
            return knobs.cache_factory(spec)
        cache = ref.make_cache(spec)
        return knobs.cache_cls(cache.k, cache.v)

    def mask(q_len: int, start: int, window: int | None) -> Tensor | None:
        return knobs.mask(q_len, start, window, "cpu")

    def rope_tables(head_dim: int, rope: RopeConfig, positions: Tensor) -> tuple[Tensor, Tensor]:
        if knobs.llama3_ignored:
            rope = _strip_llama3(rope)
        if not knobs.rope_offset:
            positions = positions - positions.min() if positions.numel() else positions
        return RotaryEmbedding(head_dim, rope).to(positions.device)(positions, torch.float32)

    def attend(q: Tensor, k: Tensor, v: Tensor, cache: Any, layer_idx: int, window: int | None, scale: float) -> Tensor:
        start, t = cache.seq_len, q.shape[2]
        keys, values = cache.update(layer_idx, k, v)
        return grouped_query_attention(q, keys, values, _mask_for(knobs, t, start, window, q.device, cache), scale)

    def load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
        return _patch_model(ref.load_model(folder, dtype, device), knobs)

    def make_model_cache(model: Any, max_seq_len: int, batch_size: int) -> Any:
        param = next(model.parameters())
        cfg = model.config
        spec = CacheSpec(
            cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, cfg.computed_head_dim, max_seq_len, param.dtype, str(param.device)
        )
        return make_cache(spec)

    def sample_probs(logits: Tensor, context: list[int], spec: SamplerSpec) -> Tensor:
        return torch.softmax(_warp_logits(logits, context, spec, knobs), dim=-1)

    def sample(logits: Tensor, context: list[int], spec: SamplerSpec, seed: int, num_draws: int) -> list[int]:
        return _sample_draws(logits, context, spec, seed, num_draws, knobs)

    def generate_stopping(model: Any, folder: Path, prompt_ids: list[int], max_new_tokens: int, stop: tuple[str, ...]) -> tuple[list[int], str]:
        return _generate_stopping(model, folder, prompt_ids, max_new_tokens, stop, knobs)

    # The reference adapter with every path a knob can reach replaced; the rest (reading the
    # cache, apply_rope, forward, generate) is infer_ref's own.
    return replace(
        ref.INFER_REF,
        name=name,
        version="mutant",
        description=description,
        make_cache=make_cache,
        attention_mask=mask,
        rope_tables=rope_tables,
        attend=attend,
        load_model=load_model,
        make_model_cache=make_model_cache,
        store_kvcache=knobs.store_kvcache or ref.INFER_REF.store_kvcache,
        paged_decode_attention=knobs.paged_decode_attention or ref.INFER_REF.paged_decode_attention,
        sample_probs=sample_probs,
        sample=sample,
        generate_stopping=generate_stopping,
    )


def engine_hooks(knobs: Knobs) -> dict[str, Any]:
    """``engine_generate`` / ``engine_trace`` over the knob's Engine class (infer_ref's own by default)."""
    if knobs.engine_class is None:
        return {}
    generate, trace = ref.engine_callables(knobs.engine_class)
    chunked_generate, chunked_trace = ref.chunked_over(trace)
    return {"engine_generate": generate, "engine_trace": trace, "engine_chunked_generate": chunked_generate, "engine_chunked_trace": chunked_trace}


@dataclass(frozen=True)
class Mutant:
    """A planted bug: its name (the ``--ir-impl`` attribute), its bug class (docs/design.md), what it does,
    and the test files worth running against it (the runner's subset)."""

    name: str
    bug_class: str
    doc: str
    knobs: Knobs
    targets: tuple[str, ...] = field(default=())

    @property
    def adapter(self) -> Adapter:
        return make_adapter(self.name, self.knobs, self.doc)

    @property
    def impl(self) -> str:
        return f"infer_ref.conformance.mutants:{self.name}"

    @property
    def judged_like(self) -> Adapter:
        """The unbroken adapter this mutant differs from by its planted bug alone (same capabilities)."""
        return ref.INFER_REF


_CACHE = ("test_cache.py",)
_MASK = ("test_masks.py",)
_ROPE = ("test_rope.py",)
_ATTN = ("test_attention.py",)
_MODEL = ("test_model.py",)
_STORE = ("test_store.py",)
_PAGED = ("test_paged_attention.py",)
_SNAPSHOT = ("test_snapshots.py",)
_STORAGE = ("test_storage_independence.py",)
_LOWP = ("test_low_precision.py",)
_SAMPLING = ("test_sampling.py",)
_STOPPING = ("test_stopping.py",)
_SCHEDULE = ("test_engine_schedule.py",)

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("rope_no_offset", BUG_CLASSES[0], "RoPE positions restart at 0 on every call instead of at seq_len.",
               Knobs(rope_offset=False), _ROPE + _MODEL),
        Mutant("decode_window_missing", BUG_CLASSES[1], "A single decode token gets no mask, so it sees past its sliding window.",
               Knobs(mask=mask_no_window_on_decode), _MASK + _ATTN + _MODEL),
        Mutant("window_off_by_one", BUG_CLASSES[2], "Sliding layers see window + 1 keys (`>=` for `>`).",
               Knobs(mask=mask_window_off_by_one), _MASK + _ATTN + _MODEL),
        Mutant("first_layer_window_everywhere", BUG_CLASSES[3], "The mask built for layer 0 (sliding in Gemma 3) is used by every layer, global ones included.",
               Knobs(first_layer_window_everywhere=True), _MODEL),
        Mutant("offset_from_sliding_layer", BUG_CLASSES[4], "The RoPE offset is layer 0's stored length, which a sliding layer caps at the window.",
               Knobs(rope_offset_from_sliding_layer=True), _MODEL),
        Mutant("mask_top_left", BUG_CLASSES[5], "Chunk masks are `ones(T, S).tril()`: query i sees keys 0..i whatever the cache holds.",
               Knobs(mask=mask_top_left_aligned), _MASK + _ATTN + _MODEL),
        Mutant("attend_unwritten_slots", BUG_CLASSES[6], "`update` returns the whole max_seq_len buffer and the mask lets the query see its zero tail.",
               Knobs(cache_cls=FullBufferCache, pad_mask_to_capacity=True), _CACHE + _ATTN + _MODEL),
        Mutant("reset_keeps_length", BUG_CLASSES[7], "`reset` zeroes the tensors but leaves seq_len, so the next request continues the last one.",
               Knobs(cache_cls=NoRestartCache), _CACHE + _MODEL),
        Mutant("advance_twice", BUG_CLASSES[8], "Both the model and its caller advance the cache: seq_len moves 2T per forward.",
               Knobs(advance="twice"), _MODEL),
        Mutant("advance_skipped_on_decode", BUG_CLASSES[8], "Prefill advances, single-token steps do not: each decode token overwrites the last.",
               Knobs(advance="skip_decode"), _MODEL),
        Mutant("v_rotated", BUG_CLASSES[9], "RoPE applied to V as well as Q and K.",
               Knobs(v_rotated=True), _MODEL),
        Mutant("qk_norm_after_rope", BUG_CLASSES[10], "Qwen3/Gemma 3 per-head q_norm/k_norm applied after RoPE instead of before.",
               Knobs(qk_norm="after_rope"), _MODEL),
        Mutant("qk_norm_missing", BUG_CLASSES[10], "Qwen3/Gemma 3 q_norm/k_norm weights loaded but never applied.",
               Knobs(qk_norm="missing"), _MODEL),
        Mutant("scale_from_head_dim", BUG_CLASSES[11], "Attention scale head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5.",
               Knobs(scale_from_head_dim=True), _MODEL),
        Mutant("embed_scale_unrounded", BUG_CLASSES[12], "Gemma embeddings multiplied by the Python float sqrt(hidden) (33.94) instead of its bf16 value (34.0).",
               Knobs(embed_scale_unrounded=True), _MODEL),
        Mutant("llama3_scaling_ignored", BUG_CLASSES[13], "rope_scaling of type llama3 dropped: plain theta ** (-2i/D) frequencies.",
               Knobs(llama3_ignored=True), _ROPE + _MODEL),
        Mutant("layers_aliased", BUG_CLASSES[14], "All layers share one storage slice (`zeros(1, ...).expand(L, ...)`).",
               Knobs(cache_factory=aliased_cache), _CACHE + _ATTN + _MODEL),
        Mutant("overflow_clamped", BUG_CLASSES[15], "Writes past capacity are truncated and advance saturates, no error.",
               Knobs(cache_cls=ClampingCache), _CACHE),
        Mutant("store_minus_one_wraps", CACHE_BUG_CLASSES[0], "The slot store indexes with -1 as well: a skipped token overwrites the cache's last slot.",
               Knobs(store_kvcache=caches.store_minus_one_wraps), _STORE),
        Mutant("paged_read_whole_last_block", CACHE_BUG_CLASSES[1], "Paged decode attends all ceil(len/bs)*bs slots of its blocks, unwritten tail included.",
               Knobs(paged_decode_attention=caches.paged_decode_reads_whole_last_block), _PAGED),
        Mutant("decode_slot_off_by_one", CACHE_BUG_CLASSES[2], "A paged cache writes each decode token at the slot of the position before it.",
               Knobs(cache_factory=caches.paged_off_by_one_cache), _CACHE + _MODEL),
        Mutant("shallow_snapshot", CACHE_BUG_CLASSES[3], "snapshot() returns views of the live K/V buffers instead of a copy.",
               Knobs(cache_cls=caches.ShallowSnapshotCache), _SNAPSHOT + _STORAGE),
        Mutant("restore_rebinds_buffers", CACHE_BUG_CLASSES[4], "restore() rebinds k/v to new tensors instead of copying into the existing ones.",
               Knobs(cache_cls=caches.RebindingRestoreCache), _SNAPSHOT + _STORAGE),
        Mutant("restore_adopts_snapshot", CACHE_BUG_CLASSES[6], "restore() and materialize() take the snapshot's own tensors as the cache's storage instead of copying them.",
               Knobs(cache_cls=caches.AdoptingRestoreCache), _CACHE + _SNAPSHOT + _STORAGE),
        Mutant("rms_norm_low_precision", EXTRA_BUG_CLASSES[0], "RMSNorm's mean of squares, rsqrt and scaling computed in the activation dtype (no fp32 upcast).",
               Knobs(norm_precision="low_accumulate"), _LOWP),
        Mutant("gemma_one_plus_w_low_precision", EXTRA_BUG_CLASSES[1], "Gemma's `1 + w` added in the weight dtype (bf16), then applied in fp32.",
               Knobs(norm_precision="gemma_one_plus_w_low"), _LOWP),
        Mutant("rope_angles_low_precision", EXTRA_BUG_CLASSES[2], "RoPE angle `position * inv_freq` formed in the activation dtype.",
               Knobs(rope_precision="angles_low"), _LOWP),
        Mutant("rope_inv_freq_low_precision", EXTRA_BUG_CLASSES[2], "RoPE inverse frequencies rounded to the model dtype (a buffer `model.to(bfloat16)` cast).",
               Knobs(rope_precision="inv_freq_low"), _LOWP),
        Mutant("top_p_before_temperature", EXTRA_BUG_CLASSES[3], "Top-k/top-p filter the raw logits, temperature is applied after (transformers: temperature first).",
               Knobs(sampler="top_p_before_temperature"), _SAMPLING),
        Mutant("top_k_ties_dropped", EXTRA_BUG_CLASSES[4], "Top-k keeps exactly the k indices `torch.topk` returns, dropping tokens tied with the k-th logit.",
               Knobs(sampler="top_k_strict"), _SAMPLING),
        Mutant("exponential_race_inverted", EXTRA_BUG_CLASSES[5], "Draws by `argmax(p * q)`, q ~ Exp(1), instead of `argmax(p / q)`: right support, wrong frequencies.",
               Knobs(sampler="race_inverted"), _SAMPLING),
        Mutant("eos_ignored", EXTRA_BUG_CLASSES[6], "EOS ids never end generation: it always runs to max_new_tokens.",
               Knobs(stopping="eos_ignored"), _STOPPING),
        Mutant("eos_from_config_only", EXTRA_BUG_CLASSES[6], "EOS ids read from config.json only: generation_config.json and the tokenizer's eos_token (Llama 3's <|eot_id|>) ignored.",
               Knobs(stopping="eos_config_only"), _STOPPING),
        Mutant("eos_first_config_id_only", EXTRA_BUG_CLASSES[6], "Only the first EOS id found (config.json's list first) ends generation: `eos_token_id` read as one int.",
               Knobs(stopping="eos_first_id_only"), _STOPPING),
        Mutant("one_token_too_many", EXTRA_BUG_CLASSES[7], "The length limit tested with `>` instead of `>=`: max_new_tokens + 1 tokens.",
               Knobs(stopping="one_token_too_many"), _STOPPING),
        Mutant("eos_dropped_from_tokens", EXTRA_BUG_CLASSES[7], "Generation stops at EOS but the EOS token is left out of the returned tokens.",
               Knobs(stopping="eos_dropped"), _STOPPING),
        Mutant("stop_first_listed", EXTRA_BUG_CLASSES[8], "With several stop strings, the text is cut at the first *listed* one found, not the earliest occurrence.",
               Knobs(stopping="stop_first_listed"), _STOPPING),
        Mutant("stop_within_token", EXTRA_BUG_CLASSES[8], "Stop strings searched in each new token's text alone: one spanning a token boundary is missed.",
               Knobs(stopping="stop_within_token"), _STOPPING),
    )
}


@dataclass(frozen=True)
class BlockManagerMutant(Mutant):
    """A mutant whose planted bug lives in the block manager (infer_ref/conformance/mutants/prefix.py)."""

    manager_cls: type[BlockManager] = BlockManager

    @property
    def adapter(self) -> Adapter:
        return prefix_adapter(self.name, self.doc, self.manager_cls)


@dataclass(frozen=True)
class DynamicCacheMutant(Mutant):
    """A mutant of infer_ref's dynamic cache, judged through its adapter (``INFER_REF_DYNAMIC``:
    no capacity, no storage to inspect) with the broken cache built by ``knobs.cache_factory``."""

    @property
    def adapter(self) -> Adapter:
        return replace(ref.INFER_REF_DYNAMIC, name=self.name, version="mutant", description=self.doc, make_cache=self.knobs.cache_factory)

    @property
    def judged_like(self) -> Adapter:
        return ref.INFER_REF_DYNAMIC


MUTANTS["update_keeps_caller_tensor"] = DynamicCacheMutant(
    "update_keeps_caller_tensor", CACHE_BUG_CLASSES[5],
    "A dynamic cache keeps the caller's k/v tensors themselves on a layer's first write instead of copying them.",
    Knobs(cache_factory=caches.caller_tensor_cache), _CACHE + _SNAPSHOT + _STORAGE,
)  # fmt: skip

# Prefix-cache mutants: planted in the block manager.
MUTANTS.update(
    (name, BlockManagerMutant(name, bug_class, " ".join((cls.__doc__ or "").split()), Knobs(), ("test_block_manager.py",), cls))
    for name, (bug_class, cls) in PREFIX_MANAGERS.items()
)

@dataclass(frozen=True)
class EngineMutant(Mutant):
    """A mutant of infer_ref's ``Engine`` (``knobs.engine_class``), judged through the reference
    adapter with nothing else changed: the model is infer_ref's own (the knobbed copy of its
    forward plans no per-row masks for a batch of rows at different lengths)."""

    @property
    def adapter(self) -> Adapter:
        return replace(ref.INFER_REF, name=self.name, version="mutant", description=self.doc, **engine_hooks(self.knobs))


# Scheduling mutants: infer_ref's Engine with one rule of the scheduling contract broken.
MUTANTS.update(
    (name, EngineMutant(name, bug_class, doc, Knobs(engine_class=engine), _SCHEDULE))
    for name, (bug_class, engine, doc) in SCHEDULE_ENGINES.items()
)

# Chunked-prefill mutants: infer_ref's Engine whose cache view gets a prompt chunk over computed
# tokens wrong, caught by the chunked == whole property of test_engine.py.
MUTANTS.update(
    (name, EngineMutant(name, bug_class, " ".join((engine.cache_class.__doc__ or "").split()), Knobs(engine_class=engine), ("test_engine.py",)))
    for name, (bug_class, engine) in CHUNK_ENGINES.items()
)

# Every class the suite must catch: DESIGN's list, then precision/sampling/stopping, cache systems,
# prefix caching, scheduling, chunked prefill.
ALL_BUG_CLASSES = BUG_CLASSES + EXTRA_BUG_CLASSES + CACHE_BUG_CLASSES + PREFIX_BUG_CLASSES + SCHEDULE_BUG_CLASSES + CHUNK_BUG_CLASSES

# The unbroken copy: all knobs at their defaults (must pass everything).
CONTROL = make_adapter("control", Knobs(), "infer_ref through the mutant machinery with no bug planted")


def __getattr__(name: str) -> Adapter:
    if name in MUTANTS:
        return MUTANTS[name].adapter
    raise AttributeError(f"module {__name__!r} has no mutant {name!r}; mutants: {', '.join(MUTANTS)}")


__all__ = ["ALL_BUG_CLASSES", "BUG_CLASSES", "CACHE_BUG_CLASSES", "CONTROL", "EXTRA_BUG_CLASSES", "MUTANTS", "PREFIX_BUG_CLASSES", "Knobs", "Mutant", "make_adapter"]
