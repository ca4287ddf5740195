"""Model-level properties on random small checkpoints of each family, in float64.

Two oracles, reported separately (``ir_oracle`` marker): transformers' full forward on the same
weights (agreement to ~1e-10 in float64) and the implementation's own full forward (*self-consistency*:
the cached path equals the uncached one to 1e-9 in float64, whatever the implementation's distance
from transformers — an implementation slightly off transformers still has its cache judged exactly).
With ``--ir-dtype bfloat16/float16`` both use the golden files' tie-aware tolerances. Gemma cases use
windows of 4-8 and sequences up to ``4 * window + 2``, so every sliding layer is crossed several
times, by prefill chunks and by decode steps.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import case_models
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_logits_agree, assert_tokens_equal, fail
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, tiny_config
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.interface.contract import layer_length
from infer_ref.conformance.oracles.golden import tolerance_for
from infer_ref.conformance.oracles.transformers_fp64 import transformers_available, transformers_logits

pytestmark = pytest.mark.ir_requires("model")
needs_transformers = pytest.mark.skipif(not transformers_available(), reason="needs transformers (the oracle)")
against_transformers = pytest.mark.ir_oracle("transformers")
self_consistency = pytest.mark.ir_oracle("self-consistency")


@st.composite
def model_runs(draw: st.DrawFn, family: str, chunked: bool = True) -> dict[str, Any]:
    """A model case, a batch of token ids, and a chunking of them (plain prefill+decode or any split)."""
    case = draw(irst.model_configs(family))
    total = draw(irst.sequence_lengths(case))
    batch = draw(st.integers(1, 2))
    chunks = draw(st.one_of(irst.chunkings(total), irst.prefill_then_decode(total))) if chunked else [total]
    return {
        "case": case,
        "ids": draw(irst.token_ids(case.hf_config["vocab_size"], batch, total)),
        "chunks": chunks,
        "slack": draw(st.integers(0, 3)),
    }


def _params(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": run["case"].describe(),
        "ids": run["ids"].tolist(),
        "chunks": run["chunks"],
        "cache slack": run["slack"],
    }


def forward(adapter: Adapter, model: Any, ids: torch.Tensor, cache: Any) -> torch.Tensor:
    assert adapter.forward is not None
    return adapter.forward(model, ids, cache)


def cache_length(adapter: Adapter, cache: Any) -> int:
    return layer_length(adapter.cache_contract, cache, 0)


def run_chunks(
    adapter: Adapter, model: Any, ids: torch.Tensor, chunks: list[int], cache: Any, full: torch.Tensor,
    params: dict[str, Any], label: str, dtype: torch.dtype,
) -> None:
    """Feed ``ids`` chunk by chunk through ``cache``; each chunk's logits must equal ``full``'s rows."""
    start = cache_length(adapter, cache)
    for c, n in enumerate(chunks):
        end = start + n
        out = forward(adapter, model, ids[:, start:end], cache)
        assert_logits_agree(
            out, full[:, start:end], dtype=dtype, what=f"{label}: logits of chunk {c} = positions [{start}, {end})", params=params
        )
        if cache_length(adapter, cache) != end:
            fail(f"{label}: cache length is {cache_length(adapter, cache)} after feeding positions [0, {end})", params=params)
        start = end


@needs_transformers
@against_transformers
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_full_forward_matches_transformers(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """The uncached forward equals transformers' float64 logits at every position.

    Guards everything that changes the function itself, identically with or without a cache:
    *V rotated by RoPE*, *QK-norm after RoPE or missing*, *wrong attention scale
    (query_pre_attn_scalar)*, *llama3 rope scaling ignored*, *window off-by-one*, *one layer's
    window applied to all layers*.
    """
    run = data.draw(model_runs(family, chunked=False), label="run")
    case = run["case"]
    model = case_models.load(ir_adapter, case, ir_dtype, ir_device)
    _, state = case_models.snapshot(case)
    expected = transformers_logits(case.hf_config, state, run["ids"], key=case_models.case_key(case))
    assert_logits_agree(
        forward(ir_adapter, model, run["ids"].to(ir_device), None),
        expected,
        dtype=ir_dtype,
        what="full-forward logits vs transformers (float64)",
        params=_params(run),
    )


@self_consistency
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_any_chunking_through_the_cache_equals_the_full_forward(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """Any split of a sequence into prefill chunks and decode steps gives, at every position, the
    full forward's logits; the cache has advanced by exactly the tokens fed.

    Guards: *RoPE position not offset by the cache length*, *sliding-window mask missing on
    decode*, *global length read from a sliding layer*, *causal mask top-left aligned for T>1 over a
    cache*, *unwritten cache slots attended*, *advance skipped or doubled*, *layers aliasing one
    cache slice*.
    """
    run = data.draw(model_runs(family), label="run")
    model = case_models.load(ir_adapter, run["case"], ir_dtype, ir_device)
    ids = run["ids"].to(ir_device)
    full = forward(ir_adapter, model, ids, None)
    assert ir_adapter.make_model_cache is not None
    cache = ir_adapter.make_model_cache(model, ids.shape[1] + run["slack"], ids.shape[0])
    run_chunks(ir_adapter, model, ids, run["chunks"], cache, full, _params(run), "cached run vs the full forward", ir_dtype)


def decode_across_windows(data: st.DataObject, family: str) -> dict[str, Any]:
    """A prompt, then one-token decode steps up to several windows past it (Gemma: 2-4 windows)."""
    case = data.draw(irst.model_configs(family), label="case")
    w = case.window or 6
    total = data.draw(st.integers(2 * w + 1, 4 * w + 2), label="total")
    prompt = data.draw(st.integers(1, total - 1), label="prompt")
    ids = data.draw(irst.token_ids(case.hf_config["vocab_size"], 1, total), label="ids")
    return {"case": case, "ids": ids, "chunks": [prompt] + [1] * (total - prompt), "slack": 0}


@self_consistency
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_decode_across_windows_equals_the_full_forward(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """Prefill then one-token decode steps up to several windows past the prompt: every step's logits
    equal the implementation's own full forward at that position (1e-9 in float64), whatever its
    distance from transformers.

    Guards: *sliding-window mask missing on decode*, *global length read from a sliding layer*,
    *RoPE position not offset by the cache length*, *advance skipped or doubled*.
    """
    run = decode_across_windows(data, family)
    model = case_models.load(ir_adapter, run["case"], ir_dtype, ir_device)
    ids = run["ids"].to(ir_device)
    full = forward(ir_adapter, model, ids, None)
    assert ir_adapter.make_model_cache is not None
    cache = ir_adapter.make_model_cache(model, ids.shape[1], 1)
    run_chunks(ir_adapter, model, ids, run["chunks"], cache, full, _params(run), "prefill + decode vs the full forward", ir_dtype)


@needs_transformers
@against_transformers
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_decode_across_windows_matches_transformers(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """Prefill then one-token decode steps up to several windows past the prompt: every decode
    step's logits equal transformers' full forward at that position.

    The cached path against the external oracle directly, so a bug shared by the cached and the
    uncached path of an implementation cannot hide behind self-consistency.
    """
    run = decode_across_windows(data, family)
    case, ids = run["case"], run["ids"]
    model = case_models.load(ir_adapter, case, ir_dtype, ir_device)
    _, state = case_models.snapshot(case)
    expected = transformers_logits(case.hf_config, state, ids, key=case_models.case_key(case))
    assert ir_adapter.make_model_cache is not None
    cache = ir_adapter.make_model_cache(model, ids.shape[1], 1)
    run_chunks(ir_adapter, model, ids.to(ir_device), run["chunks"], cache, expected, _params(run), "prefill + decode vs transformers", ir_dtype)


@pytest.mark.ir_requires("cache.reset")
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
@self_consistency
def test_reset_cache_serves_a_second_request_like_a_fresh_one(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """Prompt A through the cache, ``reset``, then prompt B: B's logits equal those of a fresh cache
    (and of B's full forward).

    Guards: *cache not reset between requests*.
    """
    first = data.draw(model_runs(family), label="first request")
    case = first["case"]
    total_b = data.draw(irst.sequence_lengths(case), label="second length")
    ids_b = data.draw(irst.token_ids(case.hf_config["vocab_size"], first["ids"].shape[0], total_b), label="second ids")
    chunks_b = data.draw(irst.chunkings(total_b), label="second chunks")
    model = case_models.load(ir_adapter, case, ir_dtype, ir_device)
    first_ids, ids_b = first["ids"].to(ir_device), ids_b.to(ir_device)
    params = {**_params(first), "second ids": ids_b.tolist(), "second chunks": chunks_b}
    assert ir_adapter.make_model_cache is not None
    capacity = max(first["ids"].shape[1], total_b) + first["slack"]
    cache = ir_adapter.make_model_cache(model, capacity, first["ids"].shape[0])
    offset = 0
    for n in first["chunks"]:
        forward(ir_adapter, model, first_ids[:, offset : offset + n], cache)
        offset += n
    cache.reset()
    if cache_length(ir_adapter, cache) != 0:
        fail(f"model cache length is {cache_length(ir_adapter, cache)} after reset", params=params)
    fresh = ir_adapter.make_model_cache(model, capacity, first["ids"].shape[0])
    expected = []
    offset = 0
    for n in chunks_b:
        expected.append(forward(ir_adapter, model, ids_b[:, offset : offset + n], fresh))
        offset += n
    full_b = forward(ir_adapter, model, ids_b, None)
    assert_logits_agree(torch.cat(expected, dim=1), full_b, dtype=ir_dtype, what="second request on a fresh cache vs its full forward", params=params)
    run_chunks(ir_adapter, model, ids_b, chunks_b, cache, full_b, params, "second request on the reset cache", ir_dtype)


@pytest.mark.ir_requires("generate")
@self_consistency
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_greedy_generate_cached_equals_uncached_and_recompute(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, family: str, data: st.DataObject) -> None:
    """Greedy ``generate`` gives the same tokens with and without the cache, and each token is the
    argmax of a full recompute of the sequence so far.

    Guards: every cache-path bug as it reaches users (tokens), including the generation loop's own
    handling of the cache (prefill once, then one token at a time).
    """
    case = data.draw(irst.model_configs(family), label="case")
    prompt_len = data.draw(st.integers(1, 2 * (case.window or 4)), label="prompt length")
    steps = data.draw(st.integers(1, 3 * (case.window or 4)), label="new tokens")
    prompt = data.draw(irst.token_ids(case.hf_config["vocab_size"], 1, prompt_len), label="prompt")[0].tolist()
    model = case_models.load(ir_adapter, case, ir_dtype, ir_device)
    params = {"model": case.describe(), "prompt": prompt, "max_new_tokens": steps}
    assert ir_adapter.generate is not None
    cached = ir_adapter.generate(model, prompt, steps, True)
    uncached = ir_adapter.generate(model, prompt, steps, False)
    expected: list[int] = []
    seq = list(prompt)
    tie = 1e-9 if ir_dtype == torch.float64 else 2 * tolerance_for(str(ir_dtype).removeprefix("torch.")).eps
    for _ in range(steps):
        logits = forward(ir_adapter, model, torch.tensor([seq], device=ir_device), None)[0, -1].double()
        top2 = torch.topk(logits, 2).values
        if float(top2[0] - top2[1]) < tie:  # a tie: argmax is not decided by the model
            break
        expected.append(int(logits.argmax()))
        seq.append(expected[-1])
    assert_tokens_equal(cached[: len(expected)], expected, what="generate(use_kv_cache=True) vs argmax of full recompute", params=params)
    assert_tokens_equal(uncached[: len(expected)], expected, what="generate(use_kv_cache=False) vs argmax of full recompute", params=params)
    if len(expected) == steps:
        assert_tokens_equal(cached, uncached, what="cached vs uncached generate", params=params)


# -- bf16 embed scale -----------------------------------------------------------------------------

EMBED_HIDDEN = 1152  # gemma-3-1b: sqrt(1152) = 33.941..., 34.0 in bfloat16


def embed_scale_checkpoint() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Gemma 3 checkpoint whose logits are the final norm of the scaled embedding, elementwise.

    Every o_proj and down_proj is zero, so each block adds exactly 0 to the residual stream
    (Gemma's norm of 0 is 0); the head is untied and equal to the identity, so logit ``i`` is
    hidden unit ``i``. Embeddings are random bf16 values with full mantissas, so ``e * 34.0`` and
    ``e * 33.94`` round to different bf16 numbers in a large share of the units.
    """
    e = EMBED_HIDDEN
    cfg = tiny_config(
        "gemma3_text",
        vocab_size=e,
        hidden_size=e,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        layer_types=["full_attention"],
        tie_word_embeddings=False,
    )
    g = torch.Generator().manual_seed(1152)
    lin = lambda *shape: torch.randn(*shape, generator=g) * 0.1  # noqa: E731
    prefix = "model.layers.0."
    state = {
        "model.embed_tokens.weight": torch.randn(e, e, generator=g),
        "lm_head.weight": torch.eye(e),
        "model.norm.weight": torch.zeros(e),
        prefix + "self_attn.q_proj.weight": lin(8, e),
        prefix + "self_attn.k_proj.weight": lin(8, e),
        prefix + "self_attn.v_proj.weight": lin(8, e),
        prefix + "self_attn.o_proj.weight": torch.zeros(e, 8),
        prefix + "self_attn.q_norm.weight": torch.zeros(8),
        prefix + "self_attn.k_norm.weight": torch.zeros(8),
        prefix + "mlp.gate_proj.weight": lin(8, e),
        prefix + "mlp.up_proj.weight": lin(8, e),
        prefix + "mlp.down_proj.weight": torch.zeros(e, 8),
    }
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        state[prefix + f"{norm}.weight"] = torch.zeros(e)
    return cfg, {k: v.to(torch.bfloat16) for k, v in state.items()}


def test_gemma_embed_scale_is_rounded_to_bf16(ir_adapter: Adapter, ir_device: str) -> None:
    """In bf16, Gemma's embeddings are multiplied by ``sqrt(hidden)`` rounded to bf16 (34.0 for
    hidden 1152), as transformers does.

    Expected values by stated arithmetic: ``x = bf16(E[id] * bf16(sqrt(1152)))``, logits =
    ``bf16(x_fp32 * rsqrt(mean(x_fp32²) + eps))`` (the final Gemma norm with zero weight, an
    identity head). A correct implementation matches in (nearly) every unit — reduction order may
    flip a rare last bit; the unrounded scale changes about a third of them.

    Guards: *embed scale not rounded to dtype*.
    """
    cfg, state = embed_scale_checkpoint()
    folder = case_models.write_custom_snapshot("embed_scale", cfg, state)
    assert ir_adapter.load_model is not None
    model = ir_adapter.load_model(folder, torch.bfloat16, ir_device)
    ids = torch.arange(0, 64).view(2, 32) * 17 % EMBED_HIDDEN
    logits = forward(ir_adapter, model, ids.to(ir_device), None).cpu()
    scale = torch.tensor(math.sqrt(EMBED_HIDDEN), dtype=torch.bfloat16)
    if float(scale) != 34.0:
        fail(f"bf16(sqrt(1152)) is {float(scale)}, expected 34.0")
    x = (state["model.embed_tokens.weight"][ids] * scale).float()
    expected = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])).to(torch.bfloat16)
    differ = logits.to(torch.bfloat16) != expected
    share = differ.float().mean().item()
    if share > 0.01:
        first = tuple(int(i) for i in differ.nonzero()[0].tolist())
        fail(
            f"{share:.1%} of bf16 logits differ from the embedding scaled by bf16(sqrt(1152)) = 34.0 and normed",
            details=[
                f"  first differing position {first}: actual {float(logits[first])}, expected {float(expected[first])}",
                "  (an unrounded scale, 33.941..., changes about a third of them)",
            ],
            params={"ids": "arange(64).view(2, 32) * 17 % 1152", "hidden": EMBED_HIDDEN},
        )
