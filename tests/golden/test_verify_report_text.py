"""What a user reads of a verification: the one-line summary and the failure diff, word for word.

The report is built by hand with every value distinct, so the expected text below is the stated
values formatted as documented (4 decimals in the diff, 3 significant digits in the summary): a
field shown from the wrong place, a dropped token text or a wrong verdict changes the text."""

from __future__ import annotations

from infer_ref.conformance.oracles.golden import Tolerance
from infer_ref.conformance.oracles.golden.results import CaseResult, StepFailure, VerifyReport, format_failure

TEXTS = {7: "seven", 8: "eight", 9: "nine"}


def _failure() -> StepFailure:
    return StepFailure(
        step=1, position=4, golden_token=7, our_token=8, golden_token_lp=-2.5, best_lp=-0.5, deficit=2.0,
        worst_token=9, worst_delta=0.75, golden_top=[(7, -0.25), (9, -1.5)], our_top=[(8, -0.5), (7, -2.5)],
        golden_margin=1.25, reasons=["first reason", "second reason"],
    )  # fmt: skip


def _report(*, failing: bool) -> VerifyReport:
    first = CaseResult(
        name="case-a", prompt_len=3, steps=2, free_match=1, max_abs_dlogprob=0.75, max_deficit=2.0,
        min_golden_margin=1.25, golden_margins=[1.25, 3.0], failures=[_failure()] if failing else [],
    )  # fmt: skip
    clean = CaseResult("case-b", 5, 4, 4, 0.125, 0.0625, 2.5, [2.5], [])
    return VerifyReport(
        path="g.json", impl="theirs", dtype="float32", device="cpu",
        tolerance=Tolerance(0.1, 0.2, "why"), cases=[first, clean],
    )  # fmt: skip


def test_the_summary_names_the_verdict_each_case_and_the_worst_distances() -> None:
    tail = (
        "[theirs, float32 on cpu]: free-running match case-a 1/2, case-b 4/4; max |Δlogprob| 0.75 (tol 0.2), "
        "max deficit 2 (eps 0.1), min golden margin 1.25"
    )
    assert _report(failing=False).summary() == "PASS g.json " + tail
    assert _report(failing=True).summary() == "FAIL g.json " + tail


def test_the_failure_diff_names_the_first_failing_step_its_values_and_token_texts() -> None:
    expected = [
        "golden mismatch: g.json [theirs, float32 on cpu] — teacher-forced logprobs differ beyond the float32 "
        "tolerance (eps 0.1, top-k atol 0.2)",
        "  case 'case-a' (prompt 3 tokens): 1 of 2 steps fail; first at step 1 (token position 4)",
        "    golden token 7 ('seven'): logprob -2.5000 here; our best is 8 ('eight') at -0.5000: margin (our best - "
        "golden) 2.0000",
        "    golden margin at this step (top1 - top2 in the golden file): 1.2500",
        "    largest top-k |Δlogprob| 0.7500 at token 9 ('nine')",
        "    golden top-k: [7 'seven':-0.2500, 9 'nine':-1.5000]",
        "    our top-k:    [8 'eight':-0.5000, 7 'seven':-2.5000]",
        "    why: first reason; second reason",
        "    free-running exact match: 1 of 2 tokens",
        "  repro: infer-ref golden verify g.json --impl theirs --device cpu",
    ]
    assert format_failure(_report(failing=True), TEXTS.__getitem__).split("\n") == expected


def test_without_token_texts_the_diff_shows_bare_ids() -> None:
    lines = format_failure(_report(failing=True)).split("\n")
    assert lines[2] == (
        "    golden token 7: logprob -2.5000 here; our best is 8 at -0.5000: margin (our best - golden) 2.0000"
    )
    assert lines[4:7] == [
        "    largest top-k |Δlogprob| 0.7500 at token 9",
        "    golden top-k: [7:-0.2500, 9:-1.5000]",
        "    our top-k:    [8:-0.5000, 7:-2.5000]",
    ]


def test_a_passing_report_has_only_the_header_and_the_repro_line() -> None:
    lines = format_failure(_report(failing=False)).split("\n")
    assert len(lines) == 2 and lines[1].startswith("  repro: ")
