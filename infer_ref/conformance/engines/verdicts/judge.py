"""The engine tier's verdicts: where a test hands over what an engine answered and gets a verdict.

Every verdict records what it saw in the ledger (the largest differences and where, the
low-precision distributions, the prefix hits), compares, and on a failure ends in :func:`fail`:
one message — the headline, one line per request or statistic that failed, and a repro (the pytest
command that reruns the test on this engine and checkpoint, and a script where one can be written).
Keyword arguments only: a verdict's inputs are named at every call.

* :func:`judge_consistency`: answers under some schedule against reference answers of the same
  requests (alone on the plain engine, cold on an emptied prefix cache), within the engine's
  self-consistency tolerance (:mod:`~infer_ref.conformance.engines.verdicts.compare`).
* :func:`judge_agreement`: every position the engine reported against the float64 oracle, position
  by position in float32/float64, by distribution in bfloat16/float16.
* :func:`judge_prefix_hits`: the cached-token counts the engine reported against the prefixes it
  had computed (:mod:`~infer_ref.conformance.engines.verdicts.prefix_hits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

import pytest

from infer_ref.conformance.engines.ledger import Ledger, PrefixHit
from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.verdicts.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.verdicts.distribution import judge
from infer_ref.conformance.engines.verdicts.oracle import distance_from_oracle
from infer_ref.conformance.engines.verdicts.positions import (
    JudgedPosition,
    disagreements,
    judged_positions,
    of_kind,
)
from infer_ref.conformance.engines.verdicts.prefix_hits import CountedPair, shortfalls
from infer_ref.conformance.engines.verdicts.repro import Case, Replay, write_repro
from infer_ref.conformance.engines.verdicts.signed_statistics import engine_signed_statistics
from infer_ref.conformance.engines.verdicts.thresholds import thresholds_for
from infer_ref.conformance.engines.verdicts.tolerances import LOW_PRECISION, agreement_tolerance
from infer_ref.conformance.report import NOT_JUDGED


class Failure(NamedTuple):
    """What a failed comparison found: the headline, one line per finding, and the tolerance a repro
    script judges at."""

    headline: str
    details: list[str]
    tolerance: float


def fail(*, case: Case, replay: Replay, headline: str, details: Sequence[str]) -> NoReturn:
    """The one way a verdict fails: the repro written, then the headline, the findings and the repro
    line(s) raised as the test's failure."""
    repro = write_repro(case, replay, f"{headline}: {details[0]}")
    raise AssertionError(headline + ":\n" + "\n".join(details) + "\n" + repro)


def judge_consistency(
    *,
    case: Case,
    ledger: Ledger,
    tolerance: float,
    requests: Sequence[EngineRequest],
    references: Sequence[EngineOutput],
    outputs: Sequence[EngineOutput],
    what: str,
    reference: str,
    replay: Replay,
) -> None:
    """``outputs`` (``what``: how the requests were sent) against ``references`` (``reference``: the
    same requests another way) within ``tolerance``; every difference recorded as a spread between
    two schedules. ``replay``: what the repro script sends and judges."""
    problems = []
    for i, (request, expected, output) in enumerate(zip(requests, references, outputs, strict=True)):
        ledger.spreads.record(case.where, largest_difference(expected, output))
        if found := compare_outputs(expected, output, tolerance):
            problems.append(f"request {i} ({len(request.prompt)} prompt tokens): " + "; ".join(found[:3]))
    if problems:
        headline = f"{what}: {len(problems)} of {len(requests)} requests differ from {reference}"
        fail(case=case, replay=replay, headline=headline, details=problems)


def judge_against_alone(
    *,
    case: Case,
    ledger: Ledger,
    tolerance: float,
    requests: Sequence[EngineRequest],
    alone: Sequence[EngineOutput],
    outputs: Sequence[EngineOutput],
    what: str,
    schedule: list[list[int]],
) -> None:
    """:func:`judge_consistency` against each request run ``alone`` on the plain engine (the
    reference of every self-consistency property); ``schedule``: how the requests were sent."""
    alone_schedule = [[i] for i in range(len(requests))]
    judge_consistency(
        case=case,
        ledger=ledger,
        tolerance=tolerance,
        requests=requests,
        references=alone,
        outputs=outputs,
        what=what,
        reference="the same request alone",
        replay=Replay(requests, [alone_schedule, schedule], tolerance),
    )


def judge_agreement(
    *,
    case: Case,
    ledger: Ledger,
    dtype: str,
    requests: Sequence[EngineRequest],
    outputs: Sequence[EngineOutput],
    kind: str,
    run_label: str = "",
    sent_before: Sequence[EngineRequest] = (),
) -> None:
    """float32/float64: every position within the oracle tolerance. bfloat16/float16: the
    distribution of the ``kind`` positions within the calibrated thresholds (``run_label`` tells
    the report's rows of one test's runs apart: "cold", "warm"). ``sent_before``: requests the
    engine ran first whose cached state ``requests`` meet (a conversation's first turns): a repro
    sends them first too."""
    model_dir = case.model_dir
    per_request = [
        judged_positions(model_dir, i, r, o) for i, (r, o) in enumerate(zip(requests, outputs, strict=True))
    ]
    low_precision = dtype in LOW_PRECISION
    if low_precision:  # each test's own kind of position (thresholds are calibrated per kind)
        per_request = [of_kind(positions, kind) for positions in per_request]
    for positions in per_request:
        ledger.distances.record(
            case.where, max((distance_from_oracle(p.entry, p.row) for p in positions), default=0.0)
        )
    if low_precision:
        test = f"{case.test} ({run_label})" if run_label else case.test
        failure = distribution_failure(ledger, model_dir, dtype, test, kind, per_request)
    else:
        failure = position_failure(per_request, dtype, requests, outputs)
    if failure:
        before, sent = range(len(sent_before)), range(len(sent_before), len(sent_before) + len(requests))
        schedule = [list(group) for group in (before, sent) if group]
        replay = Replay([*sent_before, *requests], [schedule], failure.tolerance)
        fail(case=case, replay=replay, headline=failure.headline, details=failure.details)


def position_failure(
    per_request: list[list[JudgedPosition]],
    dtype: str,
    requests: Sequence[EngineRequest],
    outputs: Sequence[EngineOutput],
) -> Failure | None:
    """Each request judged at the tolerance of its length (float32's grows past 333 positions)."""
    report, tolerances = [], []
    for positions, request, output in zip(per_request, requests, outputs, strict=True):
        tol = agreement_tolerance(dtype, len(request.prompt) + len(output.token_ids))
        found = disagreements(positions, tol)
        if found and positions:
            first = positions[0]
            where = f"request {first.request} ({first.prompt_len} prompt tokens, tolerance {tol:.3g})"
            report.append(f"{where}: " + "; ".join(found[:3]))
            tolerances.append(tol)
    if not report:
        return None
    flat = agreement_tolerance(dtype)
    grows = "" if max(tolerances) == flat else f", growing with the request's length to {max(tolerances):.3g}"
    headline = (
        f"{len(report)} of {len(requests)} requests disagree with the oracle (tolerance {flat:g}{grows})"
    )
    return Failure(headline, report, max(tolerances))


def distribution_failure(
    ledger: Ledger, model_dir: Path, dtype: str, test: str, kind: str, per_request: list[list[JudgedPosition]]
) -> Failure | None:
    """The ``kind`` positions' distribution against the calibrated thresholds, recorded in the ledger."""
    stats = [p.stat() for positions in per_request for p in positions]
    if not stats:
        return None
    thresholds = thresholds_for(dtype, kind, model_dir.name)
    summary, exceeded = judge(stats, thresholds.values)
    # Reported, not judged yet: the signed statistics with their standard errors (docs/low-precision.md,
    # "Recipe errors").
    signed = engine_signed_statistics([(p.request, p.entry, p.row) for ps in per_request for p in ps])
    ledger.distributions.append(
        {
            "test": test,
            "checkpoint": model_dir.name,
            "kind": kind,
            "dtype": dtype,
            **summary.as_dict(),
            **signed,
            "exceeded": [e.statistic for e in exceeded],
            "thresholds": thresholds.values,
            "source": thresholds.source,
        }
    )
    if not exceeded:
        return None
    headline = (
        f"the {kind} positions' distribution departs from the oracle's in {dtype} "
        f"({summary.positions} positions; {thresholds.source})"
    )
    return Failure(headline, [str(e) for e in exceeded], agreement_tolerance(dtype))


def judge_prefix_hits(
    *, ledger: Ledger, engine: str, pairs: list[CountedPair], requests: str, computed: str
) -> None:
    """``pairs``: one per request (``requests`` names them, e.g. "continued conversations") sent
    after ``computed`` ("the prompt", "the conversation") was computed on an emptied cache, with the
    counts ``engine`` reported: recorded for the report's notes, "not judged" when nothing ever hit
    or when the counts cannot be believed, failed when a request was served less than its shared
    prefix warrants.

    ``cached_tokens`` is ``None`` where the engine does not report a count for a request and ``0``
    where it reports that nothing was served (docs/adapters.md). A count on the first request after
    the cache was emptied (nothing there to serve it) is a count the tier cannot believe: an engine
    that reports, say, 1 for every request would otherwise be failed for shortfalls it never had."""
    if not pairs:
        pytest.skip(f"{NOT_JUDGED} no {requests} could be sent and read back (the report's notes say why)")
    if unbelievable := [p.first for p in pairs if p.first]:
        pytest.skip(
            f"{NOT_JUDGED} cached-token counts that cannot be believed: {engine} reported {unbelievable[0]} "
            f"cached tokens for a request sent first on an emptied prefix cache ({len(unbelievable)} of "
            f"{len(pairs)} such requests), where nothing could be served"
        )
    hits = [PrefixHit(p.shared, p.second) for p in pairs if p.second is not None]
    if not hits:
        pytest.skip(
            f"{NOT_JUDGED} no cached-token count reported: {engine} answered cached_tokens None "
            f"(not reported) for every one of {len(pairs)} {requests}"
        )
    ledger.prefix_hits += hits
    found = shortfalls(hits)
    if found is None:
        most = max((h.shared for h in hits), default=0)
        pytest.skip(
            f"{NOT_JUDGED} no prefix hit observed: {len(hits)} {requests} (up to "
            f"{most} shared tokens) were served nothing from cache"
        )
    if found:
        raise AssertionError(
            f"the prefix cache served less than {computed} computed just before ({len(found)} of {len(hits)} "
            f"{requests}):\n" + "\n".join(found)
        )


__all__ = [
    "Failure",
    "fail",
    "judge_against_alone",
    "judge_agreement",
    "judge_consistency",
    "judge_prefix_hits",
]
