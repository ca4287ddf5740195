"""Engine capability: several requests over one paged pool, judged against the exact oracle.

* **cold == warm == transformers**: for request sets where some requests share a prefix of random
  length (block-aligned or not) and unrelated requests are interleaved, every request's logits
  with prefix caching on equal those with it off and equal transformers' float64 full forward
  (<= 1e-9), for all three families and block sizes below and above Gemma's window. The test
  fails unless the engine reports a prefix hit.
* **batch row == alone**: every request's tokens and logits in a batch equal those of the same
  request run alone, greedy and with seeded sampling.
* **chunked == whole prefill** (``engine_chunked_generate``): with any per-step token budget from
  1 token up (prompt chunks sharing it with the decodes, prefix hits and a small batch), every
  request's logits and tokens equal those of whole prefills (float64, 1e-9).
* a **negative control**: the same comparison between a float64 and a float32 model must fail,
  so the check can see a numerics change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ref.conformance import case_models
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_close, assert_logits_agree
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, tiny_config
from infer_ref.conformance.interface.adapter import Adapter, EngineOutput, EngineSpec
from infer_ref.conformance.oracles.transformers_fp64 import transformers_available, transformers_logits
from infer_ref.conformance.strategies import ModelCase

pytestmark = pytest.mark.ir_requires("engine")
needs_transformers = pytest.mark.skipif(not transformers_available(), reason="transformers is not installed")

ATOL = RTOL = 1e-9
BLOCK_SIZES = (2, 4, 8, 16)  # Gemma windows are 4-8: blocks smaller and larger than the window
WINDOW_STRADDLING_BLOCKS = (2, 16)  # every drawn window lies strictly between these
MAX_NEW = 5


def _fewer(n: int, fraction: int = 2) -> Any:
    """These run whole engines: a fraction of the profile's examples (at least ``n``)."""
    current = settings()
    return settings(current, max_examples=max(n, current.max_examples // fraction))


@st.composite
def request_sets(draw: st.DrawFn, vocab: int, block_size: int) -> list[list[int]]:
    """2-3 requests sharing a prefix of ``bs+1 .. 3bs+1`` tokens (so the later ones hit at least one
    full block), 0-2 unrelated ones, in a drawn order."""
    tokens = st.integers(0, vocab - 1)
    shared = draw(st.lists(tokens, min_size=block_size + 1, max_size=3 * block_size + 1), label="shared prefix")
    sharing = [shared + draw(st.lists(tokens, max_size=block_size + 1)) for _ in range(draw(st.integers(2, 3)))]
    unrelated = [draw(st.lists(tokens, min_size=1, max_size=2 * block_size + 1)) for _ in range(draw(st.integers(0, 2)))]
    return [list(p) for p in draw(st.permutations(sharing + unrelated), label="order")]


def _run(adapter: Adapter, model: Any, prompts: list[list[int]], spec: EngineSpec) -> list[EngineOutput]:
    assert adapter.engine_generate is not None
    out = adapter.engine_generate(model, prompts, spec)
    assert len(out) == len(prompts), f"{len(prompts)} prompts gave {len(out)} results"
    for r, prompt in zip(out, prompts, strict=True):
        assert len(r.token_ids) == spec.max_new_tokens, f"prompt {prompt}: {len(r.token_ids)} tokens, asked {spec.max_new_tokens}"
        assert r.logits.shape[0] == len(r.token_ids), f"{len(r.token_ids)} tokens but logits {tuple(r.logits.shape)}"
        assert 0 <= r.num_cached_tokens <= len(prompt) - 1, f"{r.num_cached_tokens} cached tokens of a {len(prompt)}-token prompt"
    return out


def compare_runs(a: list[EngineOutput], b: list[EngineOutput], what: str, params: dict[str, Any]) -> None:
    """Logits of every request within 1e-9 (float64), then tokens equal."""
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        assert_close(ra.logits, rb.logits, what=f"{what}, request {i}", atol=ATOL, rtol=RTOL, params=params)
        assert ra.token_ids == rb.token_ids, f"{what}, request {i}: tokens {ra.token_ids} vs {rb.token_ids} ({params})"


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bs", WINDOW_STRADDLING_BLOCKS, ids=lambda b: f"block{b}")
@given(data=st.data())
@_fewer(3, fraction=4)
def test_prefix_cached_logits_equal_uncached_and_transformers(
    ir_adapter: Adapter, family: str, bs: int, data: st.DataObject
) -> None:
    """Block size 2 is smaller than every drawn Gemma window (4-8), 16 larger."""
    case = data.draw(irst.model_configs(family), label="model")
    prompts = data.draw(request_sets(case.hf_config["vocab_size"], bs), label="prompts")
    model = case_models.load(ir_adapter, case)
    params = {"family": family, "block_size": bs, "window": case.window, "prompts": prompts}
    spec = EngineSpec(max_new_tokens=MAX_NEW, block_size=bs, num_blocks=256, max_batch=4)
    warm = _run(ir_adapter, model, prompts, spec)
    assert sum(r.num_cached_tokens for r in warm) > 0, f"no prefix hit happened: the test exercised nothing ({params})"
    cold = _run(ir_adapter, model, prompts, replace(spec, enable_prefix_caching=False))
    assert all(r.num_cached_tokens == 0 for r in cold), "prefix caching off still reported hits"
    compare_runs(warm, cold, "prefix caching on vs off (float64)", params)
    _, state = case_models.snapshot(case)
    for i, (prompt, r) in enumerate(zip(prompts, warm, strict=True)):
        full = torch.tensor([prompt + r.token_ids[:-1]])  # [1, P + n - 1]: every position a token was chosen at
        expected = transformers_logits(case.hf_config, state, full, key=case_models.case_key(case))[0, len(prompt) - 1 :]
        # Against the float64 oracle: the three-tier verdict, like every other comparison with it (an
        # engine with float32 norms passes with a precision note instead of failing at 1e-9).
        assert_logits_agree(r.logits, expected, dtype=torch.float64, what=f"engine logits vs transformers, request {i}", params=params)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@given(data=st.data())
@_fewer(2)
def test_every_batch_row_equals_the_request_alone(ir_adapter: Adapter, family: str, sampling: str, data: st.DataObject) -> None:
    case = data.draw(irst.model_configs(family), label="model")
    bs = data.draw(st.sampled_from(BLOCK_SIZES), label="block_size")
    prompts = data.draw(request_sets(case.hf_config["vocab_size"], bs), label="prompts")
    seeds = tuple(data.draw(st.lists(st.integers(0, 2**31), min_size=len(prompts), max_size=len(prompts)), label="seeds"))
    temperature = 0.0 if sampling == "greedy" else 1.0
    model = case_models.load(ir_adapter, case)
    params = {"family": family, "block_size": bs, "sampling": sampling, "prompts": prompts}
    spec = EngineSpec(max_new_tokens=MAX_NEW, block_size=bs, num_blocks=256, max_batch=4, temperature=temperature, seeds=seeds)
    batched = _run(ir_adapter, model, prompts, spec)
    alone = [
        _run(ir_adapter, model, [p], replace(spec, max_batch=1, enable_prefix_caching=False, seeds=(s,)))[0]
        for p, s in zip(prompts, seeds, strict=True)
    ]
    compare_runs(batched, alone, "batch row vs the request alone (float64)", params)


@pytest.mark.ir_requires("engine.chunked_prefill")
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
@_fewer(2)
def test_chunked_prefill_equals_whole_prefill(ir_adapter: Adapter, family: str, data: st.DataObject) -> None:
    """Budgets from 1 token (one prompt token per step beside the decodes) past the longest prompt;
    blocks smaller and larger than Gemma's window, so chunks start inside, at and across it.

    Guards: *prompt chunk positions restart at 0*, *prompt chunk sees the cache past its sliding
    window*, *prompt chunk K/V not written*.
    """
    case = data.draw(irst.model_configs(family), label="model")
    bs = data.draw(st.sampled_from(WINDOW_STRADDLING_BLOCKS), label="block_size")
    prompts = data.draw(request_sets(case.hf_config["vocab_size"], bs), label="prompts")
    budget = data.draw(st.integers(1, 3 * bs + 3), label="max_num_batched_tokens")
    max_batch = data.draw(st.integers(1, 4), label="max_batch")
    model = case_models.load(ir_adapter, case)
    params = {"family": family, "block_size": bs, "window": case.window, "budget": budget, "max_batch": max_batch, "prompts": prompts}
    spec = EngineSpec(max_new_tokens=MAX_NEW, block_size=bs, num_blocks=256, max_batch=max_batch)
    assert ir_adapter.engine_chunked_generate is not None
    chunked = ir_adapter.engine_chunked_generate(model, prompts, spec, budget)
    assert len(chunked) == len(prompts), f"{len(prompts)} prompts gave {len(chunked)} results ({params})"
    compare_runs(chunked, _run(ir_adapter, model, prompts, spec), "chunked vs whole prefill (float64)", params)


def test_negative_control_the_comparison_sees_a_numerics_change(ir_adapter: Adapter) -> None:
    """Float64 vs float32 weights for the same requests: the batch-invariance check must fail."""
    cfg = {**tiny_config("llama"), "eos_token_id": [10_000]}
    case = ModelCase("llama", cfg, seed=7)
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 9]]
    spec = EngineSpec(max_new_tokens=3, block_size=2, num_blocks=64, max_batch=2)
    exact = _run(ir_adapter, case_models.load(ir_adapter, case, torch.float64), prompts, spec)
    rounded = _run(ir_adapter, case_models.load(ir_adapter, case, torch.float32), prompts, spec)
    with pytest.raises(AssertionError, match="request 0"):
        compare_runs(exact, rounded, "float64 vs float32 (must differ)", {})
