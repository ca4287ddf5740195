"""A wall-clock budget for a benchmark run: units of work that would run past it are skipped and listed.

A unit runs only if the time spent so far plus its estimate fits in the budget; a unit already
running is never stopped, so estimates err high. Estimates come from units measured earlier in the
same run (:class:`DurationEstimates`): a unit of size ``s`` (a context length, or 1) is estimated
from the measured unit of the same kind with the largest size ``<= s``, scaled linearly by
``s / size`` (linear is an upper bound for a decode point: its per-token work grows at most
linearly with the context); with none measured yet, from the kind's default.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class Budget:
    """``seconds`` of wall time from construction (None: unlimited); ``skipped`` lists what did not fit."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.perf_counter) -> None:
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"budget seconds must be a positive finite number or None, got {seconds!r}")
        self.seconds = seconds
        self.clock = clock
        self.start = clock()
        self.skipped: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return self.clock() - self.start

    def allows(self, what: str, estimate_s: float) -> bool:
        """True if ``what`` (estimated ``estimate_s``) fits; otherwise records it as skipped and returns False."""
        if self.seconds is None or self.elapsed() + estimate_s <= self.seconds:
            return True
        entry = {"what": what, "estimate_s": round(estimate_s, 1), "elapsed_s": round(self.elapsed(), 1),
                 "budget_s": self.seconds}
        self.skipped.append(entry)
        print(f"[budget] skipped {what}: {entry['elapsed_s']} s spent + {entry['estimate_s']} s estimated "
              f"> {self.seconds} s", file=sys.stderr, flush=True)
        return False


class DurationEstimates:
    """Measured durations per kind of unit and size; ``estimate`` predicts a new unit (see the module doc)."""

    def __init__(self, defaults: dict[str, float] | None = None) -> None:
        self.defaults = dict(defaults or {})
        self.records: dict[str, list[tuple[float, float]]] = {}  # kind -> [(size, seconds)]

    def record(self, kind: str, seconds: float, size: float = 1.0) -> None:
        self.records.setdefault(kind, []).append((size, seconds))

    def estimate(self, kind: str, size: float = 1.0) -> float:
        records = self.records.get(kind, [])
        below = [r for r in records if r[0] <= size]
        if below:
            ref_size, seconds = max(below)  # the largest measured size; of equal sizes, the slowest
            return seconds * size / ref_size
        if records:
            return max(seconds for _, seconds in records)
        return self.defaults.get(kind.split(":")[0], 0.0)

    @contextmanager
    def measuring(self, kind: str, size: float = 1.0) -> Iterator[None]:
        """Record the duration of the ``with`` body under ``kind`` and ``size`` (if it completes)."""
        t0 = time.perf_counter()
        yield
        self.record(kind, time.perf_counter() - t0, size)


class Units:
    """Runs one model's units of work: skipped when the budget does not fit them, failures recorded, not raised.

    ``run`` returns the unit's value, or None; then ``last_reason`` says why ("budget" or the error),
    and a failure is appended to ``errors`` (a long run keeps every other unit's results).
    ``durations`` holds the seconds of every unit that ran (compiles among them).
    """

    def __init__(self, model: str, budget: Budget, estimates: DurationEstimates) -> None:
        self.model, self.budget, self.estimates = model, budget, estimates
        self.errors: list[str] = []
        self.durations: dict[str, float] = {}
        self.last_reason = ""

    def run(self, what: str, kind: str, fn: Callable[[], T], size: float = 1.0) -> T | None:
        if not self.budget.allows(f"{self.model}: {what}", self.estimates.estimate(kind, size)):
            self.last_reason = "budget"
            return None
        t0 = time.perf_counter()
        try:
            with self.estimates.measuring(kind, size):
                return fn()
        except Exception as exc:
            self.last_reason = f"{type(exc).__name__}: {exc}"[:500]
            self.errors.append(f"{what}: {self.last_reason}")
            print(f"[compare] {self.model}: {what} FAILED: {self.last_reason}", file=sys.stderr, flush=True)
            _release_device_memory()
            return None
        finally:
            self.durations[what] = round(time.perf_counter() - t0, 3)


def _release_device_memory() -> None:
    """After a failure (often out of memory): drop what the failed unit left, so the next one has room."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
