"""Continued conversations, shared by the default and the long-context workloads: the first turns
run, then each continued (its prompt, the engine's own answer, a new turn) on the same warm engine;
and the verdict of the warm continuations against the same requests on an emptied prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.verdicts.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.verdicts.oracle import agreement_tolerance
from infer_ref.conformance.engines.verdicts.repro import write_repro

# (first turns, the engine's answers to them) -> the continued requests
Continue = Callable[[list[EngineRequest], list[EngineOutput]], list[EngineRequest]]


@dataclass(frozen=True)
class Conversation:
    """First turns, their continuations and the continuations' answers, served warm."""

    first: list[EngineRequest]
    continued: list[EngineRequest]
    answers: list[EngineOutput]


def converse(model_dir: Path, tier: EngineTier, handle: EngineHandle, first: list[EngineRequest],
             continue_turns: Continue) -> Conversation:  # fmt: skip
    """``first`` run on ``handle``, then their continuations on the same (warm) engine (requests
    whose answers the engine cannot show left out)."""
    first = tier.judgeable(model_dir, first)
    continued = tier.judgeable(model_dir, continue_turns(first, run(handle, first)))
    return Conversation(first, continued, run(handle, continued))


def judge_warm_against_cold(model_dir: Path, tier: EngineTier, handle: EngineHandle, test: str, conversation: Conversation) -> None:
    """The warm answers of the continuations against the same requests sent again on an emptied
    prefix cache, within the engine's self-consistency tolerance. A repro runs the first turns, then
    the continuations (warm), against the oracle: the warm answers that differ from cold are the
    ones it flags."""
    continued, warm = conversation.continued, conversation.answers
    handle.reset_prefix_cache()
    cold = run(handle, continued)
    tol = tier.consistency.value
    problems = []
    for i, (c, w) in enumerate(zip(cold, warm, strict=True)):
        tier.spreads.record(f"{test}[{model_dir.name}]", largest_difference(c, w))
        if found := compare_outputs(c, w, tol):
            problems.append(f"request {i} ({len(continued[i].prompt)} prompt tokens): " + "; ".join(found[:3]))
    if problems:
        n, longest = len(conversation.first), max(len(r.prompt) + r.max_tokens for r in continued)
        # The script judges the warm answers against the oracle, so at the oracle's tolerance.
        repro = write_repro(handle, test, model_dir, [*conversation.first, *continued], [[list(range(n)), list(range(n, n + len(continued)))]],
                            f"a continued conversation served warm differs from cold: {problems[0]}", agreement_tolerance(tier.dtype, longest),
                            tier.selects(), tier.start_of("stressed"))  # fmt: skip
        raise AssertionError(f"{len(problems)} of {len(continued)} continued conversations differ warm from cold:\n" + "\n".join(problems) + "\n" + repro)


__all__ = ["Continue", "Conversation", "converse", "judge_warm_against_cold"]
