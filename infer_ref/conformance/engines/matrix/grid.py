"""The matrix's layout, shared by the table and the picture: property rows grouped by what they
judge, one column block per engine with one column per model family, one cell each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infer_ref.conformance.engines.matrix.families import family_of, family_sort_key
from infer_ref.conformance.engines.matrix.results import OUTCOMES, EngineResult

# test module -> the kind of property its tests judge (agreement with the oracle kept apart from
# the engine's agreement with itself); a module not listed is its own group
GROUPS = {
    "test_agreement": "agreement with the float64 oracle",
    "test_self_consistency": "self-consistency (the engine against itself)",
    "test_conversation": "continued conversations (a prompt, the engine's answer, a new turn; served warm)",
    "test_determinism": "determinism",
    "test_stopping": "stopping",
    "test_logprobs": "logprob semantics",
    "test_long_context": "long contexts (prompts to 8193 positions: --long-context)",
}
MARKS = {"passed": "✓", "xfailed": "x", "failed": "✗", "not judged": "?", "skipped": "–"}
NOT_RUN = "·"  # the engine's results hold no case of this test on this family
MEANINGS = {
    "✓": "every case passed",
    "x": "expected failure (listed, with its cause, in the engine's xfails file)",
    "✗": "failed",
    "?": "not judged: the engine could not be started or reached (the report says why)",
    "–": "not supported by the engine, or not applicable to the checkpoint",
    NOT_RUN: "no result: the run covered no checkpoint of this family, or predates the test",
}


@dataclass(frozen=True)
class Cell:
    outcomes: tuple[str, ...]  # one per case: the checkpoints of the family, and the test's own parameters

    @property
    def text(self) -> str:
        """One mark when the cases agree, else each mark with its count (``✓4 –2``)."""
        if not self.outcomes:
            return NOT_RUN
        kinds = [o for o in OUTCOMES if o in self.outcomes]
        if len(kinds) == 1:
            return MARKS[kinds[0]]
        return " ".join(f"{MARKS[k]}{self.outcomes.count(k)}" for k in kinds)

    @property
    def worst(self) -> str:
        """The outcome that colours the cell: a failure over an expected one over one not judged over a
        pass over a skip (a cell with a test not judged never looks clean)."""
        for outcome in ("failed", "xfailed", "not judged", "passed", "skipped"):
            if outcome in self.outcomes:
                return outcome
        return "not run"


@dataclass
class Grid:
    groups: list[tuple[str, list[str]]]  # (group title, its tests in run order)
    engines: list[EngineResult]
    families: list[str]  # every family any engine ran on, in the matrix's order
    cells: dict[tuple[str, int, str], Cell]  # (test, engine index, family) -> cell

    def cell(self, test: str, engine: int, family: str) -> Cell:
        return self.cells.get((test, engine, family), Cell(()))


def build_grid(engines: Sequence[EngineResult], family: Callable[[str], str] = family_of) -> Grid:
    """Arrange ``engines``' cases: ``family`` names a checkpoint folder's family."""
    tests_of: dict[str, list[str]] = {}
    outcomes: dict[tuple[str, int, str], list[str]] = {}
    families: set[str] = set()
    known: dict[str, str] = {}
    for index, result in enumerate(engines):
        for case in result.cases:
            tests = tests_of.setdefault(case.module, [])
            if case.test not in tests:
                tests.append(case.test)
            fam = known.setdefault(case.checkpoint, family(case.checkpoint))
            families.add(fam)
            outcomes.setdefault((case.test, index, fam), []).append(case.outcome)
    order = [m for m in GROUPS if m in tests_of] + sorted(m for m in tests_of if m not in GROUPS)
    groups = [(GROUPS.get(m, m.removeprefix("test_").replace("_", " ")), tests_of[m]) for m in order]
    return Grid(
        groups,
        list(engines),
        sorted(families, key=family_sort_key),
        {key: Cell(tuple(found)) for key, found in outcomes.items()},
    )


def totals(result: EngineResult) -> str:
    """``93 passed, 8 expected failures, 11 not supported or skipped`` for one engine."""
    words = {
        "passed": "passed",
        "xfailed": "expected failure",
        "failed": "failed",
        "not judged": "not judged",
        "skipped": "not supported or skipped",
    }
    counts = [(sum(c.outcome == o for c in result.cases), words[o]) for o in OUTCOMES]
    return ", ".join(f"{n} {w}" + ("s" if w == "expected failure" and n > 1 else "") for n, w in counts if n)
