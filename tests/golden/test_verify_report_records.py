"""A verification report survives its JSON form whole, and the golden-margin percentiles are nearest-rank.

The report is built by hand with every field distinct, so a field lost or swapped on the way back
shows; the percentiles' expected values are read off the sorted list by the rule stated below."""

from __future__ import annotations

import json
import math

from infer_ref.conformance.oracles.golden import Tolerance
from infer_ref.conformance.oracles.golden.results import (
    CaseResult,
    StepFailure,
    VerifyReport,
    margin_percentiles,
)


def _report() -> VerifyReport:
    failure = StepFailure(
        step=1, position=4, golden_token=7, our_token=8, golden_token_lp=-2.5, best_lp=-0.5, deficit=2.0,
        worst_token=9, worst_delta=0.75, golden_top=[(7, -0.25), (8, -1.5)], our_top=[(8, -0.5), (7, -2.5)],
        golden_margin=1.25, reasons=["golden token is 2 below our best (> eps 0.1)"],
    )  # fmt: skip
    case = CaseResult(
        name="case-a", prompt_len=3, steps=2, free_match=1, max_abs_dlogprob=0.75, max_deficit=2.0,
        min_golden_margin=1.25, golden_margins=[1.25, 3.0], failures=[failure],
    )  # fmt: skip
    clean = CaseResult("case-b", 5, 1, 1, 0.0, 0.0, math.inf, [math.inf], [])
    return VerifyReport(
        path="g.json", impl="infer_ref", dtype="float32", device="cpu",
        tolerance=Tolerance(0.1, 0.2, "why"), cases=[case, clean], notes=["a note"],
    )  # fmt: skip


def test_a_report_survives_its_json_form() -> None:
    report = _report()
    back = VerifyReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert back == report
    assert back.cases[0].failures[0].golden_top == [(7, -0.25), (8, -1.5)]  # pairs come back as tuples


def test_a_report_without_notes_reads_back_with_none() -> None:
    data = json.loads(json.dumps(_report().to_dict()))
    del data["notes"]
    assert VerifyReport.from_dict(data).notes == []


def test_margin_percentiles_are_nearest_rank_over_the_finite_margins() -> None:
    # Sorted finite margins: [1, 2, 3, 4, 5] (n = 5); quantile q picks index round(q * (n - 1)),
    # halves up: q=0 -> 0, 0.01 -> 0, 0.05 -> 0, 0.25 -> 1, 0.5 -> 2, 0.875 -> 3.5 -> 4, 1 -> 4.
    margins = [5.0, math.inf, 3.0, 1.0, 4.0, 2.0]
    assert margin_percentiles(margins) == [1.0, 1.0, 1.0, 2.0, 3.0]
    assert margin_percentiles(margins, (0.875, 1.0, 1.5)) == [5.0, 5.0, 5.0]  # 1.5 -> 6, held at the last
    assert all(math.isnan(p) for p in margin_percentiles([math.inf], (0.0, 0.5)))
    assert len(margin_percentiles([math.inf])) == 5
