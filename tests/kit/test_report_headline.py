"""The report's headline keeps what an xfails file let pass and what was not supported in sight (the verdict alone read
"within the float32 tolerances" while the notes showed an answer 5.76 nats from the oracle)."""

from __future__ import annotations

import json

import pytest

from infer_ref.conformance.engines.ledger import SpreadLog
from infer_ref.conformance.engines.notes import spread_note
from infer_ref.conformance.report import (
    CONFORMS,
    CONFORMS_ON_SUPPORTED,
    DOES_NOT_CONFORM,
    NOTHING_JUDGED,
    PARTLY_JUDGED,
    Report,
    Tally,
    expected_failures_of,
    not_supported_reason,
    verdict_kind_of,
    verdict_of,
)


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
    assert headline == (f"verdict: **conforms: 91 of 93 tests passed** (within the float32 tolerances); **2 expected failures (listed in the xfails file); "
                        f"beyond the tolerance: {far}**")  # fmt: skip
    assert _report(91, 1, []).expected_failures == "1 expected failure (listed in the xfails file)"


def test_a_run_without_expected_failures_has_the_verdict_alone() -> None:
    report = _report(91, 0, [])
    assert report.expected_failures == ""
    assert "verdict: **conforms: 91 of 91 tests passed** (within the float32 tolerances)\n" in report.to_markdown()


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


def _engine_report(**counts: int) -> Report:
    totals = Tally()
    totals.counts.update(counts)
    report = Report(impl="--ir-engine=transformers", adapter="engine tier:", version="transformers", device="the engine's",
                    dtype="float32", capabilities={}, totals=totals)  # fmt: skip
    report.verdict, report.verdict_kind = verdict_of(report), verdict_kind_of(report)
    return report


def test_a_pass_with_tests_not_supported_conforms_only_on_what_it_supports_and_says_what_was_not() -> None:
    # old: "verdict: **within the float32 tolerances**" with 42 of 141 tests not supported, seen in totals only
    report = _engine_report(passed=94, **{"not supported": 42}, skipped=5)
    report.not_supported_reasons = {"batch": 7, "prefix_caching, reset_prefix_cache": 14, "batch, kv_budget": 7,
                                    "chunked_prefill": 7, "prefix_caching, reset_prefix_cache, cached_tokens": 7}  # fmt: skip
    [headline] = [line for line in report.to_markdown().splitlines() if line.startswith("verdict:")]
    assert headline == (
        "verdict: **conforms on what it supports: 94 of 141 tests passed** (within the float32 tolerances); "
        "not supported: 14 (prefix_caching, reset_prefix_cache), 7 (batch), 7 (batch, kv_budget), 7 (chunked_prefill), "
        "7 (prefix_caching, reset_prefix_cache, cached_tokens); 5 skipped (their reasons are in pytest's summary)"
    )
    assert json.loads(report.to_json())["verdict_kind"] == CONFORMS_ON_SUPPORTED


@pytest.mark.parametrize(("counts", "kind"), [
    ({"passed": 136}, CONFORMS),
    ({"passed": 94, "not supported": 42}, CONFORMS_ON_SUPPORTED),
    ({"passed": 90, "failed": 4, "not supported": 42}, DOES_NOT_CONFORM),
    ({"not judged": 17, "not supported": 3}, NOTHING_JUDGED),  # never "conforms", never "does not conform"
    ({"not supported": 14}, NOTHING_JUDGED),
    ({"passed": 3, "not judged": 3}, PARTLY_JUDGED),
])  # fmt: skip
def test_the_verdict_kind_never_reads_what_was_not_judged_as_conforming_or_wrong(counts: dict[str, int], kind: str) -> None:
    report = _engine_report(**counts)
    assert report.verdict_kind == kind
    headline = next(line for line in report.to_markdown().splitlines() if line.startswith("verdict:"))
    assert ("conforms" in headline) == (kind in (CONFORMS, CONFORMS_ON_SUPPORTED)), headline
    assert ("failed" in headline) == (kind == DOES_NOT_CONFORM), headline


@pytest.mark.parametrize(("skip", "group"), [
    ("not supported by transformers (batch, kv_budget)", "batch, kv_budget"),
    ("not supported by my engine 1.0 (prefix_caching: not declared by this start)", "prefix_caching: not declared by this start"),
    ("unsupported by vllm: vllm (plain start): no chunked prefill on CPU", "vllm (plain start): no chunked prefill on CPU"),
    ("unsupported by INFER_REF for every draw: ring buffer too small", "ring buffer too small"),
    ("not supported by x (cache: no cache; batch: one request at a time)", "cache: no cache; batch: one request at a time"),
    # one cause on two checkpoints, about different numbers of requests: one group
    ("not supported by s (none of the 10 requests has an id: several of /c/ckpt-a's tokens render to '')",
     "none of the requests has an id: several of a checkpoint's tokens render to ''"),
    ("not supported by s (none of the 4 requests has an id: several of /c/ckpt-b's tokens render to '')",
     "none of the requests has an id: several of a checkpoint's tokens render to ''"),
])  # fmt: skip
def test_a_not_supported_skip_is_grouped_by_what_is_missing_not_by_who_said_it(skip: str, group: str) -> None:
    assert not_supported_reason(skip) == group


def test_the_verdict_line_names_the_largest_not_supported_groups_and_counts_the_rest() -> None:
    from infer_ref.conformance.report import SUMMARY_GROUPS, not_supported_summary

    reasons = {f"cause {i}": 10 - i for i in range(SUMMARY_GROUPS + 3)}  # 10, 9, ... tests
    text = not_supported_summary(reasons)
    assert text.startswith("10 (cause 0), 9 (cause 1)")
    assert f"cause {SUMMARY_GROUPS - 1}" in text and f"cause {SUMMARY_GROUPS})" not in text
    rest = sum(10 - i for i in range(SUMMARY_GROUPS, SUMMARY_GROUPS + 3))
    assert text.endswith(f", {rest} more in 3 other groups (the report's not_supported_reasons)")
    assert not_supported_summary({"a": 2, "b": 1}) == "2 (a), 1 (b)"
