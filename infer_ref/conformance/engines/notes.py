"""The engine tier's notes for the report — gathered where the report is written, worded here
whichever process writes them.

What the tier learns about an engine lives in the process that ran its tests (the engine's name for
itself, the largest differences from the oracle and between schedules with the tolerances they
were judged at, the prefix hits seen, the requests left out as unreadable). Without xdist that is
the process that writes the report. Under xdist every worker starts its own engines and the
report is written by the controller, which runs no test: each worker hands its
:func:`tier_state` over through xdist's ``workeroutput``, and :class:`TierNotes` (registered in the
controller) merges them. Either way :func:`write_notes` turns the states into the report's notes
and into ``beyond_tolerance``, the distances past their tolerance that stand beside the verdict.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from infer_ref.conformance.engines.ledger import Ledger, PrefixHit
from infer_ref.conformance.engines.protocol import CAPABILITIES
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.engines.verdicts.prefix_hits import summary as prefix_hit_summary

if TYPE_CHECKING:
    from infer_ref.conformance.report import Report

STATE_KEY = "ir_engine_tier_state"  # the workeroutput entry


def tier_state(settings: TierSettings, ledger: Ledger, factory_kwargs: dict[str, object]) -> dict[str, Any]:
    """What one process's tier learnt, as plain data (it crosses from an xdist worker as JSON-like)."""
    if (
        settings.low_precision
    ):  # agreement is judged by distribution there: the largest distance is reported, not judged
        judged = f"not judged alone in {settings.dtype}: the distribution verdict judges agreement"
        oracle = (ledger.distances, math.inf, judged)
    else:
        oracle = (ledger.distances, *settings.oracle_note())
    logs = [oracle, (ledger.spreads, settings.consistency.value, settings.consistency.source)]
    return {
        "name": settings.name,
        "engine": ledger.engine_name,
        "options": [f"{k}={v!r}" for k, v in factory_kwargs.items()],
        "logs": [
            {
                "what": log.what,
                "largest": log.largest,
                "where": log.where,
                "comparisons": log.comparisons,
                "tolerance": tolerance,
                "source": source,
            }
            for log, tolerance, source in logs
        ],
        "prefix_hits": [[h.shared, h.cached] for h in ledger.prefix_hits],
        "left_out": ledger.left_out,
        "requests_read": len(ledger.unreadable),
        "not_continued": ledger.not_continued,
        # None: a server never reached
        "capabilities": None if ledger.capabilities is None else sorted(ledger.capabilities),
        "distributions": ledger.distributions,
    }


def write_notes(report: Report, states: Sequence[dict[str, Any]]) -> None:
    """The merged states into ``report.notes`` (and ``beyond_tolerance``), in a fixed order."""
    if not states:
        return
    declared = next((s["capabilities"] for s in states if s.get("capabilities") is not None), None)
    if declared is not None:
        report.capabilities = {c: None if c in declared else "not declared" for c in CAPABILITIES}
    engine = next((s["engine"] for s in states if s["engine"]), None)
    if engine:
        report.notes.append(f"engine: {engine}")  # read back by the engine matrix
    options = next((s["options"] for s in states if s["options"]), None)
    if options:
        report.notes.append("engine options: " + ", ".join(options))
    for index in range(len(states[0]["logs"])):
        logs = [s["logs"][index] for s in states]
        worst = max(logs, key=lambda log: log["largest"])
        comparisons = sum(log["comparisons"] for log in logs)
        note = spread_note(
            worst["what"], worst["largest"], worst["where"], comparisons, worst["tolerance"], worst["source"]
        )
        if comparisons:
            report.notes.append(note)
        if worst["largest"] > worst["tolerance"]:  # a failure the verdict must not hide, expected or not
            report.beyond_tolerance.append(note)
    report.distributions += sorted(
        (d for s in states for d in s.get("distributions", ())), key=lambda d: (d["test"], d["checkpoint"])
    )
    report.notes += [recipe_difference_note(d) for d in report.distributions if d.get("recipe_differences")]
    hits = [PrefixHit(shared, cached) for s in states for shared, cached in s["prefix_hits"]]
    if hits:
        report.notes.append(prefix_hit_summary(hits))
    left_out = [why for s in states for why in s["left_out"]]
    if left_out:
        report.notes.append(
            left_out_note(states[0]["name"], left_out, sum(s["requests_read"] for s in states))
        )
    not_continued = [why for s in states for why in s.get("not_continued", ())]
    if not_continued:
        report.notes.append(not_continued_note(not_continued))


def spread_note(
    what: str, largest: float, where: str, comparisons: int, tolerance: float, source: str
) -> str:
    """``largest difference from the oracle: 2.1e-05 nats (test[ckpt], 286 answers); tolerance ...``."""
    at = f"{where}, " if where else ""  # every difference 0: no test to name
    judged = f"tolerance {tolerance:.3g} ({source})" if tolerance != float("inf") else source
    return f"largest difference {what}: {largest:.3g} nats ({at}{comparisons} answers); {judged}"


def recipe_difference_note(row: dict[str, Any]) -> str:
    """One note per recipe-verdict row on which the engine declares a recipe difference: which, why,
    and the judged statistics in calibrated spreads from the correct recipes' centre (t in their own
    standard errors), e.g. ``recipe difference declared on gemma3-numerics-hidden304-t5 (bfloat16):
    embed_normaliser_float32 (...); measured: slope +0.9 spreads (t +21), chosen_error -0.8 (t -19); within the margin``."""
    declared = "; ".join(f"{name} ({why})" for name, why in row["recipe_differences"].items())
    judged = {n: s for n, s in row["recipe_statistics"].items() if s["judged"]}
    measured = ", ".join(f"{n} {s['spreads']:+.1f} spreads (t {s['t']:+.0f})" for n, s in judged.items())
    outcome = "beyond the margin: " + ", ".join(row["exceeded"]) if row["exceeded"] else "within the margin"
    return (
        f"recipe difference declared on {row['checkpoint']} ({row['dtype']}): {declared}; "
        f"measured: {measured}; {outcome}"
    )


def left_out_note(name: str, reasons: Sequence[str], requests: int) -> str:
    """One note: how many requests were left out as unreadable, of how many, and why (each reason
    counted, with its server address and folder elided)."""
    kinds = Counter(re.sub(r"\S*/\S*", "…", why) for why in reasons)
    listed = "; ".join(f"{count}× {why[:160]}" for why, count in kinds.most_common(4))
    why = f"requests left out because {name}'s answer cannot be read back as token ids"
    return f"{why}: {len(reasons)} of {requests} ({listed})"


def not_continued_note(reasons: Sequence[str]) -> str:
    """One note: the conversations not continued (so not judged) because their history cannot be
    sent as text."""
    listed = "; ".join(reasons[:4]) + ("; …" if len(reasons) > 4 else "")
    why = "conversations not continued, so not judged, because their history cannot be sent as text"
    return f"{why}: {len(reasons)} ({listed})"


class TierNotes:
    """In the xdist controller: each worker's state as it goes down, written into the report before
    the report is finished (the report's own ``pytest_sessionfinish`` runs after this one)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.states: list[dict[str, Any]] = []

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        state = getattr(node, "workeroutput", {}).get(STATE_KEY)
        if state is not None:
            self.states.append(state)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        write_notes(self.report, self.states)
