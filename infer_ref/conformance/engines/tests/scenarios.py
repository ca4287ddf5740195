"""What the default and the long-context workloads' tests do alike, written once: each scenario
sends its requests the way its test says and hands the answers to a verdict
(:mod:`~infer_ref.conformance.engines.verdicts.judge`). A workload's test module names its tests
(their ids are what expected-failure files and results list) and chooses the requests; the
scenario is the same for both.

Continued conversations: the first turns run, then each continued (its prompt, the engine's own
answer, a new turn) on the same warm engine. For an engine of text prompts a continuation carries the
prompt and answer as their text tokenizes
(:func:`~infer_ref.conformance.engines.workloads.prompts.history`); one that cannot be sent as text
is left out and noted, never an error: a correct engine is never failed for the kit's own prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.verdicts.judge import (
    judge_against_alone,
    judge_agreement,
    judge_consistency,
)
from infer_ref.conformance.engines.verdicts.repro import Replay
from infer_ref.conformance.engines.workloads.long import continued_long_turns, first_long_turns
from infer_ref.conformance.engines.workloads.prompts import continued_turns, first_turns
from infer_ref.conformance.report import NOT_JUDGED

# started(model_dir, kind="stressed"): the ``started`` fixture, the engine of that start on that folder
Started = Callable[..., EngineHandle]
# (first turns, the engine's answers to them, a list to which each turn that cannot be continued
# appends its reason) -> the continued requests
Continue = Callable[[list[EngineRequest], list[EngineOutput], list[str]], list[EngineRequest]]


@dataclass(frozen=True)
class Conversation:
    """First turns, their continuations and the continuations' answers, served warm."""

    first: list[EngineRequest]
    continued: list[EngineRequest]
    answers: list[EngineOutput]


def converse(
    model_dir: Path,
    engines: EngineSession,
    handle: EngineHandle,
    first: list[EngineRequest],
    continue_turns: Continue,
) -> Conversation:
    """``first`` run on ``handle``, then their continuations on the same (warm) engine (requests
    whose answers the engine cannot show left out, and turns that cannot be continued as text, each
    noted; none continued: the test is "not judged")."""
    first = engines.judgeable(model_dir, first)
    left_out: list[str] = []
    continued = continue_turns(first, run(handle, first), left_out)
    engines.not_continued(model_dir, left_out)
    if not continued:
        pytest.skip(
            f"{NOT_JUDGED} none of the {len(first)} conversations could be continued as text ({left_out[0]})"
        )
    continued = engines.judgeable(model_dir, continued)
    return Conversation(first, continued, run(handle, continued))


def conversation(model_dir: Path, engines: EngineSession, handle: EngineHandle) -> Conversation:
    """The workload's first turns, then their continuations on the same (warm) engine."""
    facts, ignore_eos = engines.facts(model_dir), engines.ignore_eos
    if engines.settings.long_context:
        first = first_long_turns(facts, model_dir, ignore_eos=ignore_eos)
        return converse(
            model_dir,
            engines,
            handle,
            first,
            lambda turns, answers, left_out: continued_long_turns(
                facts, turns, answers, ignore_eos=ignore_eos, left_out=left_out
            ),
        )
    first = first_turns(facts, ignore_eos=ignore_eos)
    return converse(
        model_dir,
        engines,
        handle,
        first,
        lambda turns, answers, left_out: continued_turns(
            facts, turns, answers, ignore_eos=ignore_eos, left_out=left_out
        ),
    )


def agreement_of(
    model_dir: Path, engines: EngineSession, handle: EngineHandle, test: str, requests: list[EngineRequest]
) -> None:
    """``requests`` in one batch on the stressed engine, every generated step against the oracle."""
    judge_agreement(
        case=engines.case(test, model_dir, handle),
        ledger=engines.ledger,
        dtype=engines.settings.dtype,
        requests=requests,
        outputs=run(handle, requests),
        kind="generated",
    )


def batch_against_alone(
    model_dir: Path,
    engines: EngineSession,
    handle: EngineHandle,
    test: str,
    requests: list[EngineRequest],
    kind: str = "stressed",
    what: str = "batched on the stressed engine",
) -> None:
    """``requests`` in one batch on the ``kind`` engine against each alone on the plain one."""
    outputs = run(handle, requests)
    judge_against_alone(
        case=engines.case(test, model_dir, handle, kind),
        ledger=engines.ledger,
        tolerance=engines.settings.consistency.value,
        requests=requests,
        alone=engines.alone_answers_to(model_dir, requests),
        outputs=outputs,
        what=what,
        schedule=[list(range(len(requests)))],
    )


def each_in_chunks_against_alone(
    model_dir: Path,
    engines: EngineSession,
    handle: EngineHandle,
    test: str,
    requests: list[EngineRequest],
    what: str,
    *,
    cold: bool = False,
) -> None:
    """Each of ``requests`` alone on the stressed engine (prefilled in chunks; ``cold``: on an
    emptied prefix cache, where the engine can empty it) against each alone on the plain one."""
    outputs = []
    for request in requests:
        if cold and "reset_prefix_cache" in handle.capabilities:
            handle.reset_prefix_cache()  # a prefix hit would shorten the prefill the test is about
        outputs += run(handle, [request])
    judge_against_alone(
        case=engines.case(test, model_dir, handle),
        ledger=engines.ledger,
        tolerance=engines.settings.consistency.value,
        requests=requests,
        alone=engines.alone_answers_to(model_dir, requests),
        outputs=outputs,
        what=what,
        schedule=[[i] for i in range(len(requests))],
    )


def conversation_against_oracle(
    model_dir: Path, engines: EngineSession, handle: EngineHandle, test: str
) -> None:
    """The workload's continued conversations, served warm, every step against the oracle."""
    talk = conversation(model_dir, engines, handle)
    judge_agreement(
        case=engines.case(test, model_dir, handle),
        ledger=engines.ledger,
        dtype=engines.settings.dtype,
        requests=talk.continued,
        outputs=talk.answers,
        kind="continued",
        sent_before=talk.first,
    )


def conversation_warm_against_cold(
    model_dir: Path, engines: EngineSession, handle: EngineHandle, test: str
) -> None:
    """The continuations served warm (on a cache emptied before the first turns) against the same
    requests sent again on an emptied prefix cache. A repro runs the first turns, then the
    continuations (warm), against the oracle (so at the oracle's tolerance): the warm answers that
    differ from cold are the ones it flags."""
    handle.reset_prefix_cache()
    talk = conversation(model_dir, engines, handle)
    handle.reset_prefix_cache()
    cold = run(handle, talk.continued)
    n, longest = len(talk.first), max(len(r.prompt) + r.max_tokens for r in talk.continued)
    replay = Replay(
        [*talk.first, *talk.continued],
        [[list(range(n)), list(range(n, n + len(talk.continued)))]],
        engines.settings.oracle_tolerance(longest),
    )
    judge_consistency(
        case=engines.case(test, model_dir, handle),
        ledger=engines.ledger,
        tolerance=engines.settings.consistency.value,
        requests=talk.continued,
        references=cold,
        outputs=talk.answers,
        what="continued conversations served warm",
        reference="the same requests on an emptied prefix cache",
        replay=replay,
    )
