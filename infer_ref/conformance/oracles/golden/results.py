"""The result of a verification: per-step failures, per-case summaries, the readable diff, and the
error that carries a failed one (:class:`GoldenMismatch`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infer_ref.conformance.oracles.golden.errors import GoldenError
from infer_ref.conformance.oracles.golden.tolerances import Tolerance
from infer_ref.errors import EXIT_FAILED_CHECK


@dataclass
class StepFailure:
    """One teacher-forced step outside tolerance."""

    step: int
    position: int  # where the golden token goes in the sequence (prompt length + step)
    golden_token: int
    our_token: int
    golden_token_lp: float  # our logprob of the golden token
    best_lp: float  # our best logprob
    deficit: float  # best_lp - golden_token_lp
    worst_token: int  # the top-k token with the largest |Δ|
    worst_delta: float
    golden_top: list[tuple[int, float]]
    our_top: list[tuple[int, float]]
    golden_margin: float  # golden top1 - top2
    reasons: list[str]


@dataclass
class CaseResult:
    name: str
    prompt_len: int
    steps: int
    free_match: int  # free-running exact-match length
    max_abs_dlogprob: float  # over golden top-k tokens, all steps
    max_deficit: float  # max over steps of (our best - our logprob of golden token)
    min_golden_margin: float  # min over steps of golden top1 - top2
    golden_margins: list[float]
    failures: list[StepFailure]


@dataclass
class VerifyReport:
    path: str
    impl: str
    dtype: str
    device: str
    tolerance: Tolerance
    cases: list[CaseResult]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.failures for c in self.cases)

    @property
    def free_match(self) -> int:
        return sum(c.free_match for c in self.cases)

    @property
    def total_steps(self) -> int:
        return sum(c.steps for c in self.cases)

    @property
    def max_abs_dlogprob(self) -> float:
        return max(c.max_abs_dlogprob for c in self.cases)

    @property
    def max_deficit(self) -> float:
        return max(c.max_deficit for c in self.cases)

    @property
    def min_golden_margin(self) -> float:
        return min(c.min_golden_margin for c in self.cases)

    def summary(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        per_case = ", ".join(f"{c.name} {c.free_match}/{c.steps}" for c in self.cases)
        return (
            f"{status} {self.path} [{self.impl}, {self.dtype} on {self.device}]: free-running match {per_case}; "
            f"max |Δlogprob| {self.max_abs_dlogprob:.3g} (tol {self.tolerance.topk_atol}), max deficit "
            f"{self.max_deficit:.3g} (eps {self.tolerance.eps}), min golden margin {self.min_golden_margin:.3g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> VerifyReport:
        cases = []
        for c in data["cases"]:
            failures = [
                StepFailure(**{**f, "golden_top": [tuple(p) for p in f["golden_top"]], "our_top": [tuple(p) for p in f["our_top"]]})
                for f in c["failures"]
            ]
            cases.append(CaseResult(**{**c, "failures": failures}))
        return VerifyReport(
            path=data["path"], impl=data["impl"], dtype=data["dtype"], device=data["device"],
            tolerance=Tolerance(**data["tolerance"]), cases=cases, notes=list(data.get("notes", [])),
        )

    def raise_for_failures(self, token_text: Callable[[int], str] | None = None) -> None:
        if not self.ok:
            raise GoldenMismatch(format_failure(self, token_text), self)


class GoldenMismatch(GoldenError, AssertionError):
    """The implementation disagrees with the golden file beyond the dtype's tolerance (CLI exit status 1)."""

    exit_code = EXIT_FAILED_CHECK

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message)
        self.report = report


def _fmt_top(top: Sequence[tuple[int, float]], token_text: Callable[[int], str] | None) -> str:
    def one(t: int, lp: float) -> str:
        text = f" {token_text(t)!r}" if token_text else ""
        return f"{t}{text}:{lp:.4f}"

    return "[" + ", ".join(one(t, lp) for t, lp in top) + "]"


def format_failure(report: VerifyReport, token_text: Callable[[int], str] | None = None) -> str:
    """The readable diff of a failed verification: the first failing step of each failing case."""

    def tok(t: int) -> str:
        return f"{t} ({token_text(t)!r})" if token_text else str(t)

    lines = [
        f"golden mismatch: {report.path} [{report.impl}, {report.dtype} on {report.device}] — "
        f"teacher-forced logprobs differ beyond the {report.dtype} tolerance "
        f"(eps {report.tolerance.eps}, top-k atol {report.tolerance.topk_atol})"
    ]
    for case in report.cases:
        if not case.failures:
            continue
        f = case.failures[0]
        lines += [
            f"  case {case.name!r} (prompt {case.prompt_len} tokens): {len(case.failures)} of {case.steps} steps fail; "
            f"first at step {f.step} (token position {f.position})",
            f"    golden token {tok(f.golden_token)}: logprob {f.golden_token_lp:.4f} here; our best is "
            f"{tok(f.our_token)} at {f.best_lp:.4f}: margin (our best - golden) {f.deficit:.4f}",
            f"    golden margin at this step (top1 - top2 in the golden file): {f.golden_margin:.4f}",
            f"    largest top-k |Δlogprob| {f.worst_delta:.4f} at token {tok(f.worst_token)}",
            f"    golden top-k: {_fmt_top(f.golden_top, token_text)}",
            f"    our top-k:    {_fmt_top(f.our_top, token_text)}",
            f"    why: {'; '.join(f.reasons)}",
            f"    free-running exact match: {case.free_match} of {case.steps} tokens",
        ]
    lines.append(f"  repro: infer-ref golden verify {report.path} --impl {report.impl} --device {report.device}")
    return "\n".join(lines)


def margin_percentiles(margins: Sequence[float], qs: Sequence[float] = (0.0, 0.01, 0.05, 0.25, 0.5)) -> list[float]:
    finite = sorted(m for m in margins if math.isfinite(m))
    if not finite:
        return [math.nan for _ in qs]
    return [finite[min(len(finite) - 1, int(q * (len(finite) - 1) + 0.5))] for q in qs]
