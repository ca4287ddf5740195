"""A test that fails because the implementation raised is reported as a refusal, with its message,
and blamed on none of the bug classes the test guards (they are not implicated by a refusal)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_run import conformance

from infer_ref.conformance.plugin import refusal_text

DECODE = ("-k", "test_decode_across_windows_equals_the_full_forward")


@pytest.mark.kit_run
def test_a_refusal_is_reported_with_its_message_and_blames_no_class(tmp_path: Path) -> None:
    # layers_aliased builds its cache from one broadcast storage slice; infer_ref's KVCache refuses it.
    run = conformance("infer_ref.conformance.mutants:layers_aliased", *DECODE, cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-4000:]
    assert run.report["totals"]["counts"]["failed"] == 3, run.report["totals"]
    refusals = run.report["refusals"]
    assert len(refusals) == 3 and all("ValueError: k broadcasts one storage slice" in r for r in refusals), refusals
    assert run.report["by_bug_class"] == {} and run.report["blame"] == {}, run.report["by_bug_class"]
    assert "refusals (the implementation raised instead of answering" in run.output


@pytest.mark.kit_run
def test_a_wrong_value_is_still_blamed_on_the_classes_the_test_guards(tmp_path: Path) -> None:
    run = conformance("infer_ref.conformance.mutants:advance_skipped_on_decode", *DECODE, cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-4000:]
    assert run.report["refusals"] == []
    assert run.report["by_bug_class"]["advance skipped or doubled"]["counts"]["failed"] == 3, run.report["by_bug_class"]
    # The test guards four classes; the follow-up probes (the cache's length among them) keep one.
    verdicts = {name: b["verdict"] for name, b in run.report["blame"].items()}
    assert verdicts.pop("advance skipped or doubled") == "implicated", run.report["blame"]
    assert set(verdicts.values()) == {"not implicated"} and len(verdicts) == 3, run.report["blame"]


def test_refusal_text_is_type_and_first_line() -> None:
    assert refusal_text(ValueError("bad window\nmore detail")) == "ValueError: bad window"
    assert refusal_text(NotImplementedError()) == "NotImplementedError"
