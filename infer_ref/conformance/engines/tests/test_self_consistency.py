"""Self-consistency: the engine against itself, reported apart from agreement with the oracle.

The reference answer of a request is the *plain* engine's (prefix caching off, whole prefill, ample
KV) with the request run alone and cold. Every other schedule of the same request — in a batch, in
another order, on a warm prefix cache, prefilled in chunks, preempted by a small KV budget — must
give the same tokens (except at near-ties, :mod:`~infer_ref.conformance.engines.verdicts.compare`) and the
same logprobs within the engine's self-consistency tolerance
(:mod:`~infer_ref.conformance.engines.verdicts.tolerances`:
the rounding spread measured between two correct schedules of that engine). An engine a little off
transformers still has its caching judged tightly here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import (
    Started,
    batch_against_alone,
    each_in_chunks_against_alone,
)
from infer_ref.conformance.engines.verdicts.judge import (
    judge_against_alone,
    judge_consistency,
    judge_prefix_hits,
)
from infer_ref.conformance.engines.verdicts.prefix_hits import CountedPair
from infer_ref.conformance.engines.verdicts.repro import Replay
from infer_ref.conformance.engines.workloads.prompts import (
    boundary_prompts,
    extending_prompts,
    greedy_requests,
    shared_prefix_prompts,
)
from infer_ref.conformance.report import NOT_JUDGED

pytestmark = pytest.mark.ir_oracle("self-consistency")


def _requests(
    model_dir: Path, engines: EngineSession, prompts: list[tuple[int, ...]], prompt_logprobs: bool = False
) -> list[EngineRequest]:
    wants = 5 if prompt_logprobs and "prompt_logprobs" in engines.capabilities else None
    return engines.judgeable(
        model_dir, greedy_requests(prompts, ignore_eos=engines.ignore_eos, prompt_logprobs=wants)
    )


def test_batch_matches_alone(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Each request inside a batch (on the stressed engine: chunked prefill, small KV budget, prefix
    caching) answers as it does alone on the plain engine.

    Guards: *batch row reads a neighbour's cache*, *preemption resumes from a stale position*."""
    facts = engines.facts(model_dir)
    requests = _requests(model_dir, engines, boundary_prompts(facts) + shared_prefix_prompts(facts))
    batch_against_alone(model_dir, engines, started(model_dir), "test_batch_matches_alone", requests)


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_permuted_order_matches(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """The same requests sent in reverse order give the same answers, prompt logprobs included.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    facts = engines.facts(model_dir)
    requests = _requests(model_dir, engines, shared_prefix_prompts(facts, seed=1), prompt_logprobs=True)
    handle = started(model_dir)
    reverse = run(handle, requests[::-1])[::-1]
    judge_against_alone(
        case=engines.case("test_permuted_order_matches", model_dir, handle),
        ledger=engines.ledger,
        tolerance=engines.settings.consistency.value,
        requests=requests,
        alone=engines.alone_answers_to(model_dir, requests),
        outputs=reverse,
        what="sent in reverse order",
        schedule=[list(range(len(requests)))[::-1]],
    )


@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_warm_prefix_cache_matches_cold(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Requests sharing a prefix run cold (cache reset), then again warm together with the same
    prompts extended by a few tokens (so an engine that reuses a prefix only when a prompt goes past
    it is judged too): the warm answers equal the cold ones, the extended ones their answers alone
    on the plain engine. Where the engine reports cached tokens and the warm pass hit nothing, the
    answers say nothing about the cache: the test is "not judged", never failed.

    Guards: *prefix hit reuses another prompt's block*."""
    facts = engines.facts(model_dir)
    base = _requests(model_dir, engines, shared_prefix_prompts(facts, seed=2))
    extended = _requests(model_dir, engines, extending_prompts(facts, [r.prompt for r in base], seed=2))
    handle = started(model_dir)
    handle.reset_prefix_cache()
    cold = run(handle, base)
    warm = run(handle, base + extended)
    if "cached_tokens" in engines.capabilities and not any(o.cached_tokens for o in warm):
        pytest.skip(
            f"{NOT_JUDGED} no prefix hit observed: the warm pass of {len(warm)} requests reported cached "
            "tokens "
            f"{[o.cached_tokens for o in warm]}, so its answers say nothing about the prefix cache"
        )
    tol = engines.settings.consistency.value
    case = engines.case("test_warm_prefix_cache_matches_cold", model_dir, handle)
    everything = list(range(len(base)))
    judge_consistency(
        case=case,
        ledger=engines.ledger,
        tolerance=tol,
        requests=base,
        references=cold,
        outputs=warm[: len(base)],
        what="the warm prefix cache",
        reference="the same requests cold",
        replay=Replay(base, [[everything], [everything]], tol),
    )
    judge_against_alone(
        case=case,
        ledger=engines.ledger,
        tolerance=tol,
        requests=extended,
        alone=engines.alone_answers_to(model_dir, extended),
        outputs=warm[len(base) :],
        what="extending prompts on the warm prefix cache",
        schedule=[list(range(len(extended)))],
    )


@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache", "cached_tokens")
def test_prefix_cache_serves_the_shared_prefix(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """A prompt, then the same prompt extended by a few tokens, on a cache emptied before each pair:
    the engine says it served the shared prompt from cache, every whole block of it at the
    granularity its own hits show (:mod:`~infer_ref.conformance.engines.verdicts.prefix_hits`). A lookup that
    stops early leaves every answer right; only the counts show it. No hit at all: "not judged".

    Guards: *prefix cache stops hitting past the first block*."""
    facts = engines.facts(model_dir)
    prompts = boundary_prompts(facts, seed=4)
    pairs = list(
        zip(
            greedy_requests(prompts, ignore_eos=False, max_tokens=2),
            greedy_requests(extending_prompts(facts, prompts, seed=4), ignore_eos=False, max_tokens=2),
            strict=True,
        )
    )
    readable = set(engines.judgeable(model_dir, [r for pair in pairs for r in pair]))
    pairs = [(first, second) for first, second in pairs if first in readable and second in readable]
    handle = started(model_dir)
    counted = []
    for first, second in pairs:
        handle.reset_prefix_cache()
        [cold] = run(handle, [first])
        [answer] = run(handle, [second])
        counted.append(CountedPair(len(first.prompt), cold.cached_tokens, answer.cached_tokens))
    judge_prefix_hits(
        ledger=engines.ledger,
        engine=engines.name,
        pairs=counted,
        requests="prompts extending one computed just before",
        computed="the prompt",
    )


@pytest.mark.ir_engine_requires("chunked_prefill")
def test_chunked_prefill_matches_whole(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Prompts longer than the stressed engine's chunk budget, each alone on it (prefilled in
    chunks), answer as on the plain engine (prefilled whole).

    Guards: *causal mask top-left aligned for T>1 over a cache*."""
    facts = engines.facts(model_dir)
    long_prompts = [p for p in boundary_prompts(facts, seed=3) if len(p) > 64]
    requests = _requests(model_dir, engines, long_prompts)
    each_in_chunks_against_alone(
        model_dir,
        engines,
        started(model_dir),
        "test_chunked_prefill_matches_whole",
        requests,
        "prefilled in chunks of 64 tokens",
    )
