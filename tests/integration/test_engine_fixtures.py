"""infer_ref's Engine on the trained fixture checkpoints (all three families, float64).

* one request, prefix caching off, reproduces ``generate`` (tokens, text, finish reason), greedy
  and seeded;
* chat requests sharing a system prompt: logits with caching on == off == transformers (float64 oracle);
* every hash forced equal: token verification keeps the outputs equal to the no-cache run;
* a pool too small for all requests at once: requests wait or are preempted and recomputed, and
  the outputs do not change; every block is free afterwards and the cache serves the next call;
* bad requests are refused with a clear error before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infer_ref import Engine, SamplingParams, Tokenizer, generate, load_model, render_chat_template
from infer_ref.conformance.assertions import assert_close
from infer_ref.conformance.oracles.allocator import collide_all
from infer_ref.conformance.oracles.float64_definition import lift_float32_casts

transformers = pytest.importorskip("transformers")

CHECKPOINTS = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
FIXTURES = ("llama-tiny", "qwen3-tiny", "gemma3-tiny")
SYSTEM = "You are a terse assistant. Answer with one word, in lower case, and never explain anything."
QUESTIONS = ("What colour is the sky?", "Name a fruit.", "What is two plus two?", "Say hello.")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=FIXTURES)
def fixture(request):
    folder = CHECKPOINTS / request.param
    model, config = load_model(folder, dtype=torch.float64, device="cpu")
    tokenizer = Tokenizer(folder)
    prompts = [
        tokenizer.encode(
            render_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], config.model_type),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]
    return folder, model, config, tokenizer, prompts


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def test_one_request_without_prefix_caching_reproduces_generate(fixture) -> None:
    _, model, _, tokenizer, prompts = fixture
    engine = Engine(model, tokenizer, num_blocks=64, block_size=4, enable_prefix_caching=False, max_batch=1)
    for params in (GREEDY, SamplingParams(temperature=0.9, top_k=20, seed=11, max_new_tokens=8)):
        expected = generate(model, tokenizer, prompts[0], params, device="cpu")
        (ours,) = engine.generate([prompts[0]], params)
        assert (ours.token_ids, ours.text, ours.finish_reason) == (expected.token_ids, expected.text, expected.finish_reason)


def test_shared_system_prompt_cold_equals_warm_equals_transformers(fixture) -> None:
    folder, model, _, _, prompts = fixture
    warm_engine = Engine(model, num_blocks=256, block_size=8, max_batch=4)
    warm = warm_engine.generate(prompts, GREEDY, keep_logits=True)
    cold = Engine(model, num_blocks=256, block_size=8, enable_prefix_caching=False).generate(prompts, GREEDY, keep_logits=True)
    # The first request is admitted into an empty cache; the others find the system prompt's blocks.
    hits = [r.num_cached_tokens for r in warm]
    assert hits[0] == 0 and all(h >= 8 for h in hits[1:]), hits
    assert warm_engine.stats.prefill_tokens_computed < sum(len(p) for p in prompts)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    lift_float32_casts(theirs, json.loads((Path(folder) / "config.json").read_text()))  # the float64 oracle
    for i, (prompt, w, c) in enumerate(zip(prompts, warm, cold, strict=True)):
        assert w.step_logits is not None and c.step_logits is not None
        assert_close(w.step_logits, c.step_logits, what=f"request {i}: caching on vs off")
        assert w.token_ids == c.token_ids
        with torch.no_grad():
            expected = theirs(torch.tensor([prompt + w.token_ids[:-1]])).logits[0, len(prompt) - 1 :]
        assert_close(w.step_logits, expected, what=f"request {i}: engine vs transformers")


def test_every_hash_equal_still_gives_the_uncached_outputs(fixture) -> None:
    """With one hash for every block the map holds one entry, the last block published: the short
    requests (one full block each) hit it; after the long ones publish deeper blocks, every
    lookup finds a block of other tokens, which only token verification refuses."""
    _, model, _, _, prompts = fixture
    requests = [p[:5] for p in prompts] + prompts  # 5 tokens and <= 2 fed: each short one fills block 0 only
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    colliding = Engine(model, num_blocks=256, block_size=4, max_batch=1, hash_fn=collide_all)
    got = colliding.generate(requests, params, keep_logits=True)
    assert sum(r.num_cached_tokens > 0 for r in got) >= 2, [r.num_cached_tokens for r in got]
    cold = Engine(model, num_blocks=256, block_size=4, enable_prefix_caching=False).generate(requests, params, keep_logits=True)
    for i, (g, c) in enumerate(zip(got, cold, strict=True)):
        assert g.step_logits is not None and c.step_logits is not None
        assert_close(g.step_logits, c.step_logits, what=f"request {i}: all hashes equal vs no cache")
        assert g.token_ids == c.token_ids


def test_a_small_pool_makes_requests_wait_or_recompute_without_changing_outputs(fixture) -> None:
    _, model, _, _, prompts = fixture
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    roomy = Engine(model, num_blocks=512, block_size=4, max_batch=4)
    expected = roomy.generate(prompts, params, keep_logits=True)
    need = max(-(-(len(p) + params.max_new_tokens - 1) // 4) for p in prompts)
    tight = Engine(model, num_blocks=need + 2, block_size=4, max_batch=4)
    got = tight.generate(prompts, params, keep_logits=True)
    assert tight.stats.preemptions > 0, "the pool was never short: the test did not exercise preemption"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.step_logits is not None and e.step_logits is not None
        assert_close(g.step_logits, e.step_logits, what=f"request {i}: small pool (preempted) vs roomy pool")
        assert g.token_ids == e.token_ids
    assert tight.pool.num_free == tight.pool.num_blocks, "blocks left in use after every request finished"
    again = tight.generate(prompts[:1], params)
    assert again[0].num_cached_tokens > 0, "the second call found nothing of the first one cached"


def test_bad_requests_are_refused_before_anything_runs(fixture) -> None:
    _, model, config, _, prompts = fixture
    engine = Engine(model, num_blocks=8, block_size=4)
    cases = [
        (([], GREEDY), "non-empty list"),
        (([[]], GREEDY), "prompt 0 is empty"),
        (([[config.vocab_size]], GREEDY), "outside"),
        (([[1], [2]], [GREEDY]), "one per prompt"),
        (([prompts[0]], GREEDY), "could never run"),
        (([[1]], SamplingParams(temperature=0.0, max_new_tokens=2, stop=("x",))), "no tokenizer"),
    ]
    for (args, match) in cases:
        with pytest.raises(ValueError, match=match):
            engine.generate(*args)
        assert engine.pool.num_free == engine.pool.num_blocks
    with pytest.raises(ValueError, match="max_batch"):
        Engine(model, num_blocks=8, max_batch=0)
