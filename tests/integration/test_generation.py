"""Seed 000's integration tests on the trained fixture checkpoints (all three families).

Greedy decoding with the cache must equal decoding without it (tokens, text, finish reason) and
transformers' greedy generate; seeded sampling must not depend on the cache; the canonical prompts
must get their corpus answers with a top-1/top-2 margin of at least 1 nat at every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infer_ref import SamplingParams, Tokenizer, generate, load_model, render_chat_template

transformers = pytest.importorskip("transformers")

CHECKPOINTS = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
FIXTURES = ("llama-tiny", "qwen3-tiny", "gemma3-tiny")
MIN_MARGIN = 1.0


@pytest.fixture(scope="module", params=FIXTURES)
def fixture(request):
    folder = CHECKPOINTS / request.param
    model, config = load_model(folder, dtype=torch.float32, device="cpu")
    provenance = json.loads((folder / "PROVENANCE.json").read_text())
    return folder, model, config, Tokenizer(folder), provenance["canonical"]


def _prompt_ids(tokenizer: Tokenizer, config, case: dict) -> list[int]:
    text = render_chat_template(case["messages"], config.model_type, **case.get("chat_options", {}))
    return tokenizer.encode(text, add_special_tokens=False)


def test_greedy_cached_equals_uncached_and_corpus_answer(fixture) -> None:
    _, model, config, tokenizer, canonical = fixture
    for case in canonical:
        prompt = _prompt_ids(tokenizer, config, case)
        params = SamplingParams(temperature=0.0, max_new_tokens=len(case["generated_ids"]) + 8)
        cached = generate(model, tokenizer, prompt, params, device="cpu", use_kv_cache=True)
        uncached = generate(model, tokenizer, prompt, params, device="cpu", use_kv_cache=False)
        assert cached.token_ids == uncached.token_ids
        assert cached.text == uncached.text == case["expected"]
        assert cached.finish_reason == uncached.finish_reason == "eos"


def test_greedy_equals_transformers_generate(fixture) -> None:
    folder, model, config, tokenizer, canonical = fixture
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for case in canonical:
        prompt = _prompt_ids(tokenizer, config, case)
        ours = generate(model, tokenizer, prompt, SamplingParams(temperature=0.0, max_new_tokens=80), device="cpu")
        with torch.no_grad():
            out = theirs.generate(torch.tensor([prompt]), max_new_tokens=80, do_sample=False,
                                  eos_token_id=list(config.eos_token_ids), pad_token_id=config.pad_token_id or 0)
        assert ours.token_ids == out[0, len(prompt):].tolist(), case["messages"]


@torch.no_grad()
def test_canonical_margins_at_least_one_nat(fixture) -> None:
    _, model, config, tokenizer, canonical = fixture
    for case in canonical:
        prompt = _prompt_ids(tokenizer, config, case)
        answer = case["generated_ids"]
        logits = model(torch.tensor([prompt + answer]))[0, len(prompt) - 1 : -1]  # predicts each answer token
        logprobs = logits.log_softmax(-1)
        top2 = logprobs.topk(2, dim=-1)
        assert top2.indices[:, 0].tolist() == answer
        margins = top2.values[:, 0] - top2.values[:, 1]
        assert margins.min().item() >= MIN_MARGIN, f"{case['messages']}: min margin {margins.min().item():.3f} nats"


def test_long_canonical_crosses_three_gemma_windows() -> None:
    gemma = json.loads((CHECKPOINTS / "gemma3-tiny" / "config.json").read_text())
    provenance = json.loads((CHECKPOINTS / "gemma3-tiny" / "PROVENANCE.json").read_text())
    longest = max(len(c["prompt_ids"]) + len(c["generated_ids"]) for c in provenance["canonical"])
    assert longest > 3 * gemma["sliding_window"]


def test_seeded_sampling_cached_equals_uncached(fixture) -> None:
    _, model, config, tokenizer, canonical = fixture
    prompt = _prompt_ids(tokenizer, config, canonical[0])
    params = SamplingParams(temperature=1.5, top_k=50, seed=7, max_new_tokens=24)
    cached = generate(model, tokenizer, prompt, params, device="cpu", use_kv_cache=True)
    uncached = generate(model, tokenizer, prompt, params, device="cpu", use_kv_cache=False)
    assert cached.token_ids == uncached.token_ids
    assert cached.text == uncached.text
