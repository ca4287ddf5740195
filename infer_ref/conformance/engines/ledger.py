"""The ledger of one run: what the engine tier observed, written by the verdicts and the session,
read by the report's notes (:mod:`~infer_ref.conformance.engines.notes`).

It holds observations only — the largest differences seen (from the oracle, between two schedules)
and where, the low-precision distributions, the prefix hits the engine reported, the requests left
out because their answers cannot be read back, and the engine's name for itself. What they are
judged against lives in the settings and the verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpreadLog:
    """The largest logprob difference this run saw between two answers (two schedules of one
    engine, or the engine and the oracle), and where: what a tolerance must cover."""

    what: str  # "between two schedules" or "from the oracle"
    largest: float = 0.0
    where: str = ""
    comparisons: int = 0

    def record(self, where: str, difference: float) -> None:
        self.comparisons += 1
        if difference > self.largest:
            self.largest, self.where = difference, where


@dataclass(frozen=True)
class PrefixHit:
    """One extending request: ``shared`` prompt tokens were computed before, ``cached`` were reported
    served from the prefix cache."""

    shared: int
    cached: int


@dataclass
class Ledger:
    """Everything this process's tier observed (under xdist, one worker's share)."""

    spreads: SpreadLog = field(default_factory=lambda: SpreadLog("between two schedules"))  # self-consistency
    distances: SpreadLog = field(default_factory=lambda: SpreadLog("from the oracle"))  # agreement
    distributions: list[dict[str, Any]] = field(
        default_factory=list
    )  # low precision: one per test and checkpoint
    prefix_hits: list[PrefixHit] = field(default_factory=list)  # what the engine said its prefix cache served
    # (checkpoint, request) -> why its answer cannot be read back as token ids, None where it can
    unreadable: dict[tuple[str, object], str | None] = field(default_factory=dict)
    engine_name: str | None = None  # the first started engine's name for itself (its version)
    # what the engine declares: its factory's, or a server's once reached (None: a server never reached)
    capabilities: frozenset[str] | None = None
    not_continued: list[str] = field(default_factory=list)  # conversations not continued as text, and why

    @property
    def left_out(self) -> list[str]:
        """Why each request left out could not be read back (one entry per request)."""
        return [why for why in self.unreadable.values() if why is not None]


__all__ = ["Ledger", "PrefixHit", "SpreadLog"]
