"""A conversation continued — the request a chat server sees most: the previous prompt, the
engine's own answer to it and a new turn, sent after the first turn so that a prefix-caching
engine serves the prompt and the answer from cache (for Gemma 3, a cached part longer than the
sliding window: every first turn but the shortest crosses gemma3-tiny's window of 8).

Judged against the oracle (agreement, as the agreement tests judge) and against the same requests
on a cold cache (self-consistency).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.agreement import continued_turns, first_turns
from infer_ref.conformance.engines.agreement_verdict import judge_agreement
from infer_ref.conformance.engines.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest
from infer_ref.conformance.engines.repro import write_repro
from infer_ref.conformance.engines.session import EngineTier, run


def _conversation(model_dir: Path, tier: EngineTier, handle: EngineHandle) -> tuple[list[EngineRequest], list[EngineOutput]]:
    """The first turns, then their continuations on the same (warm) engine."""
    facts, ignore_eos = tier.facts(model_dir), "ignore_eos" in tier.capabilities
    first = tier.judgeable(model_dir, first_turns(facts, ignore_eos=ignore_eos))
    continued = tier.judgeable(model_dir, continued_turns(facts, first, run(handle, first), ignore_eos=ignore_eos))
    return continued, run(handle, continued)


@pytest.mark.ir_oracle("transformers float64")
def test_continued_conversation_agrees_with_oracle(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Every step of each continued conversation against the oracle, on the stressed engine
    (its prompt and answer cached, chunked prefill, a small KV budget).

    Guards: *prefix hit reuses another prompt's block*, *causal mask top-left aligned for T>1 over a cache*."""
    handle = started(model_dir)
    handle_requests, outputs = _conversation(model_dir, tier, handle)
    judge_agreement(model_dir, tier, handle, "test_continued_conversation_agrees_with_oracle", handle_requests, outputs, "continued")


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_continued_conversation_matches_cold(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """The continuations served warm (the first turns cached) answer as the same requests sent
    again on an emptied prefix cache.

    Guards: *prefix hit reuses another prompt's block*."""
    handle = started(model_dir)
    handle.reset_prefix_cache()
    continued, warm = _conversation(model_dir, tier, handle)
    handle.reset_prefix_cache()
    cold = run(handle, continued)
    tol = tier.consistency.value
    problems = []
    for i, (c, w) in enumerate(zip(cold, warm, strict=True)):
        tier.spreads.record(f"test_continued_conversation_matches_cold[{model_dir.name}]", largest_difference(c, w))
        if found := compare_outputs(c, w, tol):
            problems.append(f"request {i} ({len(continued[i].prompt)} prompt tokens): " + "; ".join(found[:3]))
    if problems:
        everything = list(range(len(continued)))
        repro = write_repro(handle, "test_continued_conversation_matches_cold", model_dir, continued, [[everything], [everything]],
                            f"a continued conversation served warm differs from cold: {problems[0]}", tol, tier.selects(),
                            tier.start_of("stressed"))  # fmt: skip
        raise AssertionError(f"{len(problems)} of {len(continued)} continued conversations differ warm from cold:\n" + "\n".join(problems) + "\n" + repro)
