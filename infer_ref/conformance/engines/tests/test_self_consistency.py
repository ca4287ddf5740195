"""Self-consistency: the engine against itself, reported apart from agreement with the oracle.

The reference answer of a request is the *plain* engine's (prefix caching off, whole prefill, ample
KV) with the request run alone and cold. Every other schedule of the same request — in a batch, in
another order, on a warm prefix cache, prefilled in chunks, preempted by a small KV budget — must
give the same tokens (except at near-ties, :mod:`~infer_ref.conformance.engines.verdicts.compare`) and the
same logprobs within the engine's self-consistency tolerance (:mod:`~infer_ref.conformance.engines.verdicts.tolerances`:
the rounding spread measured between two correct schedules of that engine). An engine a little off
transformers still has its caching judged tightly here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.prefix_hit_verdict import judge_prefix_hits
from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.verdicts.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.verdicts.judge import judge_against_alone
from infer_ref.conformance.engines.verdicts.prefix_hits import PrefixHit
from infer_ref.conformance.engines.verdicts.repro import write_repro
from infer_ref.conformance.engines.workloads.prompts import (
    boundary_prompts,
    extending_prompts,
    greedy_requests,
    shared_prefix_prompts,
)
from infer_ref.conformance.report import NOT_JUDGED

pytestmark = pytest.mark.ir_oracle("self-consistency")


def _requests(model_dir: Path, tier: EngineTier, prompts: list[tuple[int, ...]], prompt_logprobs: bool = False) -> list[EngineRequest]:
    wants = 5 if prompt_logprobs and "prompt_logprobs" in tier.capabilities else None
    return tier.judgeable(model_dir, greedy_requests(prompts, ignore_eos="ignore_eos" in tier.capabilities, prompt_logprobs=wants))


def test_batch_matches_alone(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Each request inside a batch (on the stressed engine: chunked prefill, small KV budget, prefix
    caching) answers as it does alone on the plain engine.

    Guards: *batch row reads a neighbour's cache*, *preemption resumes from a stale position*."""
    facts = tier.facts(model_dir)
    requests = _requests(model_dir, tier, boundary_prompts(facts) + shared_prefix_prompts(facts))
    judge_against_alone(model_dir, tier, requests, run(started(model_dir), requests), "batched on the stressed engine",
                   "test_batch_matches_alone", [list(range(len(requests)))])  # fmt: skip


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_permuted_order_matches(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """The same requests sent in reverse order give the same answers, prompt logprobs included.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    facts = tier.facts(model_dir)
    requests = _requests(model_dir, tier, shared_prefix_prompts(facts, seed=1), prompt_logprobs=True)
    handle = started(model_dir)
    reverse = run(handle, requests[::-1])[::-1]
    judge_against_alone(model_dir, tier, requests, reverse, "sent in reverse order", "test_permuted_order_matches",
                   [list(range(len(requests)))[::-1]])  # fmt: skip


@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_warm_prefix_cache_matches_cold(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Requests sharing a prefix run cold (cache reset), then again warm together with the same
    prompts extended by a few tokens (so an engine that reuses a prefix only when a prompt goes past
    it is judged too): the warm answers equal the cold ones, the extended ones their answers alone
    on the plain engine. Where the engine reports cached tokens and the warm pass hit nothing, the
    answers say nothing about the cache: the test is "not judged", never failed.

    Guards: *prefix hit reuses another prompt's block*."""
    facts = tier.facts(model_dir)
    base = _requests(model_dir, tier, shared_prefix_prompts(facts, seed=2))
    extended = _requests(model_dir, tier, extending_prompts(facts, [r.prompt for r in base], seed=2))
    handle = started(model_dir)
    handle.reset_prefix_cache()
    cold = run(handle, base)
    warm = run(handle, base + extended)
    if "cached_tokens" in tier.capabilities and not any(o.cached_tokens for o in warm):
        pytest.skip(f"{NOT_JUDGED} no prefix hit observed: the warm pass of {len(warm)} requests reported cached tokens "
                    f"{[o.cached_tokens for o in warm]}, so its answers say nothing about the prefix cache")  # fmt: skip
    tol = tier.consistency.value
    warm_base = warm[: len(base)]
    for c, w in zip(cold, warm_base, strict=True):
        tier.spreads.record(f"test_warm_prefix_cache_matches_cold[{model_dir.name}]", largest_difference(c, w))
    problems = [f"request {i}: " + "; ".join(p[:3]) for i, (c, w) in enumerate(zip(cold, warm_base, strict=True)) if (p := compare_outputs(c, w, tol))]
    if problems:
        everything = list(range(len(base)))
        repro = write_repro(handle, "test_warm_prefix_cache_matches_cold", model_dir, base, [[everything], [everything]],
                            f"warm prefix cache differs from cold: {problems[0]}", tol, tier.selects(), tier.start_of("stressed"))  # fmt: skip
        raise AssertionError("warm prefix cache differs from cold:\n" + "\n".join(problems) + "\n" + repro)
    judge_against_alone(model_dir, tier, extended, warm[len(base):], "extending prompts on the warm prefix cache",
                   "test_warm_prefix_cache_matches_cold", [list(range(len(extended)))])  # fmt: skip


@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache", "cached_tokens")
def test_prefix_cache_serves_the_shared_prefix(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """A prompt, then the same prompt extended by a few tokens, on a cache emptied before each pair:
    the engine says it served the shared prompt from cache, every whole block of it at the
    granularity its own hits show (:mod:`~infer_ref.conformance.engines.verdicts.prefix_hits`). A lookup that
    stops early leaves every answer right; only the counts show it. No hit at all: "not judged".

    Guards: *prefix cache stops hitting past the first block*."""
    facts = tier.facts(model_dir)
    prompts = boundary_prompts(facts, seed=4)
    pairs = list(zip(greedy_requests(prompts, ignore_eos=False, max_tokens=2),
                     greedy_requests(extending_prompts(facts, prompts, seed=4), ignore_eos=False, max_tokens=2), strict=True))  # fmt: skip
    readable = set(tier.judgeable(model_dir, [r for pair in pairs for r in pair]))
    pairs = [(first, second) for first, second in pairs if first in readable and second in readable]
    handle = started(model_dir)
    hits = []
    for first, second in pairs:
        handle.reset_prefix_cache()
        run(handle, [first])
        [answer] = run(handle, [second])
        hits.append(PrefixHit(len(first.prompt), answer.cached_tokens or 0))
    judge_prefix_hits(tier, hits, "prompts extending one computed just before", "the prompt")


@pytest.mark.ir_engine_requires("chunked_prefill")
def test_chunked_prefill_matches_whole(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Prompts longer than the stressed engine's chunk budget, each alone on it (prefilled in
    chunks), answer as on the plain engine (prefilled whole).

    Guards: *causal mask top-left aligned for T>1 over a cache*."""
    facts = tier.facts(model_dir)
    long_prompts = [p for p in boundary_prompts(facts, seed=3) if len(p) > 64]
    requests = _requests(model_dir, tier, long_prompts)
    handle = started(model_dir)
    outputs = [run(handle, [r])[0] for r in requests]
    judge_against_alone(model_dir, tier, requests, outputs, "prefilled in chunks of 64 tokens", "test_chunked_prefill_matches_whole",
                   [[i] for i in range(len(requests))])  # fmt: skip
