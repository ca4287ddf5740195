"""Self-consistency: the engine against itself, reported apart from agreement with the oracle.

The reference answer of a request is the *plain* engine's (prefix caching off, whole prefill, ample
KV) with the request run alone and cold. Every other schedule of the same request — in a batch, in
another order, on a warm prefix cache, prefilled in chunks, preempted by a small KV budget — must
give the same tokens (except at near-ties, :mod:`~infer_ref.conformance.engines.compare`) and the
same logprobs within the engine's self-consistency tolerance (:mod:`~infer_ref.conformance.engines.consistency`:
the rounding spread measured between two correct schedules of that engine). An engine a little off
transformers still has its caching judged tightly here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.repro import write_repro
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.workload import (
    BLOCK_SIZE,
    boundary_prompts,
    greedy_requests,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.ir_oracle("self-consistency")


def _requests(model_dir: Path, tier: EngineTier, prompts: list[tuple[int, ...]], prompt_logprobs: bool = False) -> list[EngineRequest]:
    wants = 5 if prompt_logprobs and "prompt_logprobs" in tier.capabilities else None
    return tier.judgeable(model_dir, greedy_requests(prompts, ignore_eos="ignore_eos" in tier.capabilities, prompt_logprobs=wants))


def _against_alone(model_dir: Path, tier: EngineTier, requests: list[EngineRequest], outputs: list[EngineOutput], what: str,
                   test: str, schedule: list[list[int]]) -> None:  # fmt: skip
    """``outputs`` (the requests as ``schedule`` sent them to the stressed engine) against each request alone."""
    tol = tier.consistency.value
    report = []
    for i, (request, output) in enumerate(zip(requests, outputs, strict=True)):
        reference = tier.alone(model_dir, request)
        tier.spreads.record(f"{test}[{model_dir.name}]", largest_difference(reference, output))
        problems = compare_outputs(reference, output, tol)
        if problems:
            report.append(f"request {i} ({len(request.prompt)} prompt tokens): " + "; ".join(problems[:3]))
    if report:
        summary = f"{what}: {len(report)} of {len(requests)} requests differ from the same request alone"
        alone = [[i] for i in range(len(requests))]
        repro = write_repro(tier.handle(model_dir, "stressed"), test, model_dir, requests, [alone, schedule], f"{summary}: {report[0]}", tol,
                            tier.selects())  # fmt: skip
        raise AssertionError(summary + ":\n" + "\n".join(report) + "\n" + repro)


def test_batch_matches_alone(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Each request inside a batch (on the stressed engine: chunked prefill, small KV budget, prefix
    caching) answers as it does alone on the plain engine.

    Guards: *batch row reads a neighbour's cache*, *preemption resumes from a stale position*."""
    facts = tier.facts(model_dir)
    requests = _requests(model_dir, tier, boundary_prompts(facts) + shared_prefix_prompts(facts))
    _against_alone(model_dir, tier, requests, run(started(model_dir), requests), "batched on the stressed engine",
                   "test_batch_matches_alone", [list(range(len(requests)))])  # fmt: skip


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_permuted_order_matches(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """The same requests sent in reverse order give the same answers, prompt logprobs included.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    facts = tier.facts(model_dir)
    requests = _requests(model_dir, tier, shared_prefix_prompts(facts, seed=1), prompt_logprobs=True)
    handle = started(model_dir)
    reverse = run(handle, requests[::-1])[::-1]
    _against_alone(model_dir, tier, requests, reverse, "sent in reverse order", "test_permuted_order_matches",
                   [list(range(len(requests)))[::-1]])  # fmt: skip


@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_warm_prefix_cache_matches_cold(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Requests sharing a prefix, run cold (cache reset) and then warm: the warm answers equal the
    cold ones, and the warm pass really hit the cache (where the engine reports cached tokens).

    Guards: *prefix hit reuses another prompt's block*."""
    facts = tier.facts(model_dir)
    requests = _requests(model_dir, tier, shared_prefix_prompts(facts, seed=2))
    handle = started(model_dir)
    handle.reset_prefix_cache()
    cold = run(handle, requests)
    warm = run(handle, requests)
    if "cached_tokens" in tier.capabilities:
        hits = [o.cached_tokens or 0 for o in warm]
        assert sum(h >= BLOCK_SIZE for h in hits) * 2 > len(hits), f"the warm pass hit the prefix cache too rarely to judge it: cached tokens {hits}"
    tol = tier.consistency.value
    for c, w in zip(cold, warm, strict=True):
        tier.spreads.record(f"test_warm_prefix_cache_matches_cold[{model_dir.name}]", largest_difference(c, w))
    problems = [f"request {i}: " + "; ".join(p[:3]) for i, (c, w) in enumerate(zip(cold, warm, strict=True)) if (p := compare_outputs(c, w, tol))]
    if problems:
        everything = list(range(len(requests)))
        repro = write_repro(handle, "test_warm_prefix_cache_matches_cold", model_dir, requests, [[everything], [everything]],
                            f"warm prefix cache differs from cold: {problems[0]}", tol, tier.selects())  # fmt: skip
        raise AssertionError("warm prefix cache differs from cold:\n" + "\n".join(problems) + "\n" + repro)


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
    _against_alone(model_dir, tier, requests, outputs, "prefilled in chunks of 64 tokens", "test_chunked_prefill_matches_whole",
                   [[i] for i in range(len(requests))])  # fmt: skip
