"""Chunked prefill (``Engine(max_num_batched_tokens=...)``): exact against whole prefills in float64
for any budget, with prefix hits and preemption; decodes first in every step; the chunk count
from the budget's arithmetic."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.profiles import one_thread
from infer_ref.conformance.tiers import EXACT_FLOAT64, needed_tolerance
from infer_ref.engine import SamplingParams
from infer_ref.engine.engine import Engine
from infer_ref.loader import load_model

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"


@pytest.fixture(scope="module", params=["llama-tiny", "gemma3-tiny"])
def model64(request: pytest.FixtureRequest) -> Iterator[torch.nn.Module]:
    with one_thread():  # the module on one thread
        model, _ = load_model(FIXTURES / request.param, dtype=torch.float64, device="cpu")
        yield model


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(40)]
    return [shared + [rng.randrange(3, 300) for _ in range(n)] for n in (1, 9, 30)] + [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 70)]


@pytest.mark.parametrize("budget", [1, 5, 17, 64])
@pytest.mark.parametrize("num_blocks", [64, 8], ids=["ample", "small-pool"])
def test_chunked_prefill_equals_whole_prefill_in_float64(model64: torch.nn.Module, budget: int, num_blocks: int) -> None:
    prompts = _prompts(budget)
    params = [SamplingParams(temperature=0.0, max_new_tokens=12) for _ in prompts]
    whole = Engine(model64, num_blocks=64, block_size=16, enable_prefix_caching=False).generate(prompts, params, keep_logits=True)
    engine = Engine(model64, num_blocks=num_blocks, block_size=16, max_batch=4, max_num_batched_tokens=budget)
    chunked = engine.generate(prompts, params, keep_logits=True)
    for i, (a, b) in enumerate(zip(whole, chunked, strict=True)):
        assert a.step_logits is not None and b.step_logits is not None
        assert needed_tolerance(b.step_logits, a.step_logits) <= EXACT_FLOAT64, f"request {i}, budget {budget}"
        assert a.token_ids == b.token_ids, f"request {i}, budget {budget}"
    assert sum(r.num_cached_tokens for r in chunked) > 0, "the shared 40-token prefix was never a hit"


@pytest.mark.parametrize("budget", [3, 8, 40])
def test_chunked_prefill_through_preemption_equals_whole_prefill(model64: torch.nn.Module, budget: int) -> None:
    """Two requests of 30 prompt tokens and 40 generated each need 5 blocks of 16 at their end;
    the pool has 7: both run at first, and one is preempted (and recomputed in chunks) as they grow."""
    rng = random.Random(budget)
    prompts = [[rng.randrange(3, 300) for _ in range(30)] for _ in range(2)]
    forced = [[rng.randrange(3, 300) for _ in range(40)] for _ in prompts]  # teacher-forced: no EOS ends one early
    params = [SamplingParams(temperature=0.0, max_new_tokens=40) for _ in prompts]
    whole = Engine(model64, num_blocks=64, block_size=16, enable_prefix_caching=False).generate(prompts, params, forced_tokens=forced, keep_logits=True)
    engine = Engine(model64, num_blocks=7, block_size=16, max_num_batched_tokens=budget)
    chunked = engine.generate(prompts, params, forced_tokens=forced, keep_logits=True)
    assert engine.stats.preemptions > 0
    for a, b in zip(whole, chunked, strict=True):
        assert a.step_logits is not None and b.step_logits is not None
        assert needed_tolerance(b.step_logits, a.step_logits) <= EXACT_FLOAT64 and a.token_ids == b.token_ids


def test_decodes_run_first_and_chunks_take_the_rest(model64: torch.nn.Module) -> None:
    """Budget 8; request 0 (3 tokens, 5 generated), request 1 (100 tokens). Step 1: request 0's
    whole prompt (3) and request 1's first chunk (5). Steps 2-5: request 0 decodes (1 token) and
    request 1 takes 7 each (28; 33 computed). Steps 6-13: 8 each (64; 97), step 14: the last 3.
    So 1 + 1 + 4 + 8 + 1 = 15 prefill forwards, and request 0 finishes while request 1 is still
    prefilling: it never waits behind the long prompt."""
    rng = random.Random(3)
    prompts = [[5, 6, 7], [rng.randrange(3, 300) for _ in range(100)]]
    params = [SamplingParams(temperature=0.0, max_new_tokens=5), SamplingParams(temperature=0.0, max_new_tokens=2)]
    engine = Engine(model64, num_blocks=64, block_size=16, enable_prefix_caching=False, max_num_batched_tokens=8)
    engine.generate(prompts, params)
    assert engine.stats.prefill_forwards == 15
    assert engine.stats.prefill_tokens_computed == 103
    steps = [(step.running, step.prefilling) for step in engine.stats.schedule]  # every step, chunk-only ones too
    assert steps[0] == ((), (0, 1)), steps  # both prompts' first chunks
    assert steps[1:5] == [((0,), (1,))] * 4, steps  # request 0's four decodes, each beside a chunk of request 1
    assert steps[5:14] == [((), (1,))] * 9, steps  # request 1's remaining chunks alone
    assert steps[14:] == [((1,), ())], steps  # request 1's one decode after its first token


@pytest.mark.parametrize("engine_name", ["chunk_positions_restart", "chunk_kv_unwritten"])
def test_the_kit_s_chunked_hook_shows_a_planted_chunk_bug(model64: torch.nn.Module, engine_name: str) -> None:
    """``engine_chunked_generate`` over an Engine with a planted chunk bug departs from whole
    prefills by far more than the kit's 1e-9: the kit's property can fail."""
    from infer_ref.conformance.adapters import reference as ref
    from infer_ref.conformance.interface.adapter import EngineSpec
    from infer_ref.conformance.mutants.engine import CHUNK_ENGINES

    _, planted = CHUNK_ENGINES[engine_name]
    chunked, _ = ref.chunked_over(ref.engine_callables(planted)[1])
    spec = EngineSpec(max_new_tokens=4, block_size=16, num_blocks=64, max_batch=2)
    prompts = _prompts(7)[3:]  # 3 and 70 tokens: the long one is prefilled in chunks
    broken, whole = chunked(model64, prompts, spec, 16), ref.engine_generate(model64, prompts, spec)
    assert needed_tolerance(broken[1].logits, whole[1].logits) > 1e-3
