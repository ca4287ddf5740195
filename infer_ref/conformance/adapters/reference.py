"""infer_ref's own adapter: the first user of the protocol in :mod:`infer_ref.conformance.interface.adapter`.

Select it with ``--ir-impl=infer_ref.conformance.adapters.reference:INFER_REF`` (the default). Every callable is
a thin call into the real code: the suite tests ``KVCache``, ``attention_mask``, the RoPE tables
and the decoders themselves, not copies of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import infer_ref
from infer_ref.attention import cached_attention
from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.factory import DEFAULT_BLOCK_SIZE, build_cache
from infer_ref.cache.protocol import plan_step
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.config import ModelConfig, RopeConfig
from infer_ref.conformance.interface.adapter import (
    Adapter,
    CacheSpec,
    EngineOutput,
    EngineSpec,
    EngineStep,
    SamplerSpec,
)
from infer_ref.conformance.interface.contract import CacheContract
from infer_ref.conformance.oracles.allocator import driver_factory
from infer_ref.engine.generate import generate as _generate
from infer_ref.fast.kernels import paged_decode_attention, store_kvcache
from infer_ref.loader import load_model as _load_model
from infer_ref.masks import attention_mask
from infer_ref.models.common import RotaryEmbedding, apply_rope
from infer_ref.sampling import SamplingParams, sample_token, warp_logits
from infer_ref.tokenizer import Tokenizer


def make_cache(spec: CacheSpec) -> KVCache:
    return KVCache.allocate(
        spec.num_layers,
        spec.num_kv_heads,
        spec.head_dim,
        spec.max_seq_len,
        batch_size=spec.batch_size,
        dtype=spec.dtype,
        device=spec.device,
    )


def read_cache(cache: Any, layer_idx: int) -> tuple[Tensor, Tensor]:
    """``[B, Hkv, seq_len, D]`` K and V of one layer (every infer_ref cache type has ``get_kv``)."""
    k, v = cache.get_kv(layer_idx)
    return k, v


def cache_storage(cache: KVCache) -> Sequence[Tensor]:
    return (cache.k, cache.v)


def mask(q_len: int, start: int, window: int | None) -> Tensor | None:
    return attention_mask(q_len, start, window, "cpu")


def rope_tables(head_dim: int, rope: RopeConfig, positions: Tensor) -> tuple[Tensor, Tensor]:
    return RotaryEmbedding(head_dim, rope).to(positions.device)(positions, torch.float32)


def attend(
    q: Tensor, k: Tensor, v: Tensor, cache: Any, layer_idx: int, window: int | None, scale: float
) -> Tensor:
    """The attention core of ``infer_ref.models.common.Attention`` after projections and RoPE: the
    cache plans the step (positions, the mask over what its ``update`` returns), as in the model."""
    step = plan_step(cache, q.shape[2], [window] * cache.num_layers, q.device)
    return cached_attention(cache, layer_idx, q, k, v, step.mask(layer_idx), scale)  # [B, H, T, D]


def load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    model, _ = _load_model(folder, dtype=dtype, device=device)
    if torch.device(device).type == "cuda":
        # infer_ref as it runs on CUDA: the length-aware decode kernels and the Triton store.
        from infer_ref.fast.modules import use_fast_modules

        use_fast_modules(model)
    return model


def make_model_cache(model: Any, max_seq_len: int, batch_size: int) -> KVCache:
    param = next(model.parameters())
    return KVCache.from_model_config(
        model.config, max_seq_len, batch_size=batch_size, dtype=param.dtype, device=param.device
    )


@torch.inference_mode()
def forward(model: Any, input_ids: Tensor, cache: Any) -> Tensor:
    if cache is None:
        return model(input_ids)
    return model(input_ids, kv_cache=cache, all_logits=True)


class _NoTokenizer:
    """``generate`` decodes text for stop strings; the suite compares token ids only."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return ""


def generate(model: Any, prompt_ids: list[int], max_new_tokens: int, use_kv_cache: bool) -> list[int]:
    device = next(model.parameters()).device
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    result = _generate(model, _NoTokenizer(), prompt_ids, params, device=device, use_kv_cache=use_kv_cache)
    return list(result.token_ids)


def snapshot(cache: Any) -> KVSnapshot:
    return cache.snapshot()


def restore(cache: Any, snap: KVSnapshot) -> None:
    cache.restore(snap)


def materialize(snap: KVSnapshot) -> Any:
    return snap.materialize()
def engine_callables(engine_class: type | None = None) -> tuple[Any, Any]:
    """``engine_generate`` and ``engine_trace`` over infer_ref's ``Engine`` (or a subclass of it)."""

    def run(model: Any, prompts: list[list[int]], spec: EngineSpec, budget: int | None = None) -> tuple[list[EngineOutput], list[EngineStep]]:
        from infer_ref.engine.engine import Engine

        engine = (engine_class or Engine)(
            model,
            num_blocks=spec.num_blocks,
            block_size=spec.block_size,
            enable_prefix_caching=spec.enable_prefix_caching,
            max_batch=spec.max_batch,
            max_num_batched_tokens=budget,
        )
        seeds = spec.seeds or (None,) * len(prompts)
        params = [SamplingParams(temperature=spec.temperature, seed=s, max_new_tokens=spec.max_new_tokens) for s in seeds]
        results = engine.generate(prompts, params, keep_logits=True)
        out = []
        for r in results:
            assert r.step_logits is not None  # keep_logits and at least one token per request
            out.append(EngineOutput(r.token_ids, r.step_logits, r.num_cached_tokens))
        return out, [EngineStep(s.running, s.waiting, s.prefilling) for s in engine.stats.schedule]

    def engine_generate(model: Any, prompts: list[list[int]], spec: EngineSpec) -> list[EngineOutput]:
        return run(model, prompts, spec)[0]

    return engine_generate, run


engine_generate, engine_trace = engine_callables()


def chunked_over(trace: Any) -> tuple[Any, Any]:
    """``engine_chunked_generate`` and ``engine_chunked_trace`` over an ``engine_trace`` of
    :func:`engine_callables` (which takes the budget as a fourth argument)."""

    def engine_chunked_trace(model: Any, prompts: list[list[int]], spec: EngineSpec, max_num_batched_tokens: int) -> tuple[list[EngineOutput], list[EngineStep]]:
        return trace(model, prompts, spec, max_num_batched_tokens)

    def engine_chunked_generate(model: Any, prompts: list[list[int]], spec: EngineSpec, max_num_batched_tokens: int) -> list[EngineOutput]:
        return engine_chunked_trace(model, prompts, spec, max_num_batched_tokens)[0]

    return engine_chunked_generate, engine_chunked_trace


engine_chunked_generate, engine_chunked_trace = chunked_over(engine_trace)


def rms_norm(model: Any, x: Tensor) -> Tensor:
    """The final norm, the module the forward applies before the LM head."""
    with torch.inference_mode():
        return model.norm(x)


def model_rope_tables(model: Any, positions: Tensor, layer_idx: int) -> tuple[Tensor, Tensor]:
    """The tables ``DecoderLM.forward`` builds for layer ``layer_idx``: its layer type's rotary module,
    cast to the activation dtype (the embedding's)."""
    rotary = model.rotary[model.config.layer_types[layer_idx]]
    with torch.inference_mode():
        return rotary(positions.to(rotary.inv_freq.device), model.embed_tokens.weight.dtype)


def _sampling_params(spec: SamplerSpec) -> SamplingParams:
    return SamplingParams(
        temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p, repetition_penalty=spec.repetition_penalty
    )


def sample_probs(logits: Tensor, context: list[int], spec: SamplerSpec) -> Tensor:
    """``softmax(warp_logits(...))``: the distribution ``sample_token`` draws from."""
    return torch.softmax(warp_logits(logits, context, _sampling_params(spec)), dim=-1)


def sample(logits: Tensor, context: list[int], spec: SamplerSpec, seed: int, num_draws: int) -> list[int]:
    params = _sampling_params(spec)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return [sample_token(logits, context, params, generator) for _ in range(num_draws)]


def generate_stopping(
    model: Any, folder: Path, prompt_ids: list[int], max_new_tokens: int, stop: tuple[str, ...]
) -> tuple[list[int], str]:
    """Greedy ``generate`` with the snapshot's tokenizer: EOS ids from config.json and the tokenizer
    (which reads generation_config.json and tokenizer_config.json), and ``stop`` strings."""
    device = next(model.parameters()).device
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)
    result = _generate(model, Tokenizer(folder), prompt_ids, params, device=device)
    return list(result.token_ids), result.text


INFER_REF = Adapter(
    name="infer_ref",
    version=infer_ref.__version__,
    description="the reference implementation (KVCache, models.common, loader, engine.generate)",
    make_cache=make_cache,
    read_cache=read_cache,
    cache_storage=cache_storage,
    attention_mask=mask,
    rope_tables=rope_tables,
    apply_rope=apply_rope,
    attend=attend,
    load_model=load_model,
    make_model_cache=make_model_cache,
    forward=forward,
    generate=generate,
    store_kvcache=store_kvcache,
    paged_decode_attention=paged_decode_attention,
    snapshot=snapshot,
    restore=restore,
    materialize=materialize,
    make_block_manager=driver_factory(),
    engine_generate=engine_generate,
    engine_trace=engine_trace,
    engine_chunked_generate=engine_chunked_generate,
    engine_chunked_trace=engine_chunked_trace,
    rms_norm=rms_norm,
    model_rope_tables=model_rope_tables,
    sample_probs=sample_probs,
    sample=sample,
    generate_stopping=generate_stopping,
)
ADAPTER = INFER_REF


# -- the other cache types, judged by the same suite -------------------------------------------------

# The paged adapters use a block size that divides none of the suite's usual lengths and a free list
# shuffled with a fixed seed, so consecutive positions land in scattered physical blocks.
PAGED_BLOCK_SIZE = 3
PAGED_SCRAMBLE_SEED = 1234


def cache_adapter(kind: str, **build: Any) -> Adapter:
    """infer_ref with every cache (the cache, model and generate capabilities) of type ``kind``."""

    def make_kind_cache(spec: CacheSpec) -> Any:
        config = _spec_config(spec)
        return build_cache(kind, config, spec.max_seq_len, batch_size=spec.batch_size, dtype=spec.dtype, device=spec.device, **build)

    def make_kind_model_cache(model: Any, max_seq_len: int, batch_size: int) -> Any:
        param = next(model.parameters())
        return build_cache(kind, model.config, max_seq_len, batch_size=batch_size, dtype=param.dtype, device=param.device, **build)

    def generate_kind(model: Any, prompt_ids: list[int], max_new_tokens: int, use_kv_cache: bool) -> list[int]:
        device = next(model.parameters()).device
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        result = _generate(model, _NoTokenizer(), prompt_ids, params, device=device, use_kv_cache=use_kv_cache, cache=kind,
                           block_size=build.get("block_size", DEFAULT_BLOCK_SIZE))
        return list(result.token_ids)

    unsupported = {}
    if kind == "dynamic":
        unsupported["cache.bounded"] = unsupported["cache.capacity"] = "no capacity: the cache grows by concatenation"
    if kind in ("dynamic", "paged"):
        unsupported["cache.memory_bytes"] = (
            "memory_bytes counts the positions held (dynamic) or the blocks held (paged), not a capacity; "
            "infer_ref's own cache tests check those formulas"
        )
        unsupported["cache.storage"] = "no zero-filled storage to inspect: reset drops positions or returns blocks"
    return replace(
        INFER_REF,
        name=f"infer_ref[{kind}]",
        description=f"infer_ref with its {kind} KV cache",
        make_cache=make_kind_cache,
        make_model_cache=make_kind_model_cache,
        generate=generate_kind,
        cache_storage=cache_storage if kind in ("contiguous", "static") else None,
        declared_unsupported=unsupported,
        # The static cache's update returns its whole max_seq_len buffer; its masks hide the rest.
        cache_contract=CacheContract(update_returns="buffer") if kind == "static" else INFER_REF.cache_contract,
        # Judged once, through INFER_REF: they do not depend on the cache type.
        store_kvcache=None,
        paged_decode_attention=None,
        make_block_manager=None,
        engine_generate=None,
        engine_trace=None,
        engine_chunked_generate=None,
        engine_chunked_trace=None,
        rms_norm=None,
        model_rope_tables=None,
        sample_probs=None,
        sample=None,
        generate_stopping=None,
    )


def _spec_config(spec: CacheSpec) -> ModelConfig:
    """A minimal ModelConfig with a cache spec's geometry (what build_cache reads)."""
    return ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "vocab_size": 8,
            "hidden_size": spec.num_kv_heads * spec.head_dim,
            "intermediate_size": 8,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_kv_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
        }
    )


INFER_REF_STATIC = cache_adapter("static")
INFER_REF_DYNAMIC = cache_adapter("dynamic")
INFER_REF_PAGED = cache_adapter("paged", block_size=PAGED_BLOCK_SIZE, scramble_seed=PAGED_SCRAMBLE_SEED)
