"""The report's headline keeps what an xfails file let pass in sight (the verdict alone read
"within the float32 tolerances" while the notes showed an answer 5.76 nats from the oracle)."""

from __future__ import annotations

from infer_ref.conformance.engines.ledger import SpreadLog
from infer_ref.conformance.engines.notes import spread_note
from infer_ref.conformance.report import Report, Tally, expected_failures_of


def _report(passed: int, xfailed: int, beyond: list[str]) -> Report:
    totals = Tally()
    totals.counts.update(passed=passed, xfailed=xfailed)
    report = Report(impl="--ir-engine=llama.cpp", adapter="engine tier:", version="llama.cpp", device="the engine's",
                    dtype="float32", capabilities={}, totals=totals, verdict="within the float32 tolerances",
                    beyond_tolerance=beyond)  # fmt: skip
    report.expected_failures = expected_failures_of(report)
    return report


def test_expected_failures_and_the_distance_past_the_tolerance_stand_beside_the_verdict() -> None:
    far = "largest difference from the oracle: 5.76 nats (test_generated_logprobs_agree_with_oracle[gemma3-tiny], 286 answers); tolerance 0.0002 (the oracle tolerance for float32)"
    headline = next(line for line in _report(91, 2, [far]).to_markdown().splitlines() if line.startswith("verdict:"))
    assert headline == (f"verdict: **within the float32 tolerances**; **2 expected failures (listed in the xfails file); "
                        f"beyond the tolerance: {far}**")  # fmt: skip
    assert _report(91, 1, []).expected_failures == "1 expected failure (listed in the xfails file)"


def test_a_run_without_expected_failures_has_the_verdict_alone() -> None:
    report = _report(91, 0, [])
    assert report.expected_failures == ""
    assert "verdict: **within the float32 tolerances**\n" in report.to_markdown()


def test_a_spread_summary_names_its_test_only_when_one_differed() -> None:
    log = SpreadLog("between two schedules")
    for _ in range(20):
        log.record("test_batch_matches_alone[llama-tiny]", 0.0)
    # Old: "0 nats (, 20 answers)"
    assert spread_note(log.what, log.largest, log.where, log.comparisons, 1e-5, "measured") == "largest difference between two schedules: 0 nats (20 answers); tolerance 1e-05 (measured)"
    log.record("test_batch_matches_alone[qwen3-tiny]", 2.5e-6)
    assert spread_note(log.what, log.largest, log.where, log.comparisons, 1e-5, "measured") == (
        "largest difference between two schedules: 2.5e-06 nats (test_batch_matches_alone[qwen3-tiny], 21 answers); "
        "tolerance 1e-05 (measured)"
    )
