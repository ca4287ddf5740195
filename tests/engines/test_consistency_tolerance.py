"""Self-consistency tolerances: where each comes from, and the values refused."""

from __future__ import annotations

import pytest

from infer_ref.conformance.engines.ledger import SpreadLog
from infer_ref.conformance.engines.notes import spread_note
from infer_ref.conformance.engines.verdicts import tolerances as consistency
from infer_ref.conformance.engines.verdicts.tolerances import (
    FLOOR,
    MARGIN,
    agreement_tolerance,
    consistency_tolerance,
)


def test_a_measured_engine_gets_its_spread_times_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consistency, "MEASURED_SPREAD", {("vllm", "float32"): 3e-6, ("tiny", "float32"): 1e-9, ("wide", "float32"): 1e-3})
    assert consistency_tolerance("vllm", "float32").value == pytest.approx(MARGIN * 3e-6)
    assert consistency_tolerance("tiny", "float32").value == FLOOR  # bitwise-equal engines still get rounding room
    assert consistency_tolerance("wide", "float32").value == agreement_tolerance("float32")  # never looser than the oracle
    assert "3e-06" in consistency_tolerance("vllm", "float32").source


def test_an_unmeasured_engine_is_judged_at_the_oracle_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consistency, "MEASURED_SPREAD", {("vllm", "float32"): 3e-6})
    for engine, dtype in ((None, "float32"), ("vllm", "bfloat16"), ("my_engine", "float32")):
        tol = consistency_tolerance(engine, dtype)
        assert tol.value == agreement_tolerance(dtype) and "no spread measured" in tol.source


def test_a_given_tolerance_overrides_within_the_oracle_tolerance() -> None:
    assert consistency_tolerance(None, "float32", 5e-6).value == 5e-6
    ceiling = agreement_tolerance("float32")
    for bad in (0.0, -1e-6, 2 * ceiling, float("nan")):
        with pytest.raises(ValueError, match=r"--ir-consistency-tolerance must be in \(0, 0.0002\] for float32"):
            consistency_tolerance(None, "float32", bad)


def test_spread_log_keeps_the_largest_and_where() -> None:
    log = SpreadLog("between two schedules")
    for test, value in (("a", 1e-6), ("b", 4e-6), ("a", 2e-6)):
        log.record(test, value)
    assert (log.largest, log.where, log.comparisons) == (4e-6, "b", 3)
    note = spread_note(log.what, log.largest, log.where, log.comparisons, 1e-5, "given")
    assert note.startswith("largest difference between two schedules: 4e-06 nats (b, 3 answers)")


def test_spread_log_names_the_first_place_of_a_tied_largest() -> None:
    log = SpreadLog("from the oracle")
    log.record("a", 0.0)  # nothing above zero yet: no place to name
    assert (log.largest, log.where) == (0.0, "")
    for test in ("b", "c"):
        log.record(test, 3e-6)
    assert (log.largest, log.where, log.comparisons) == (3e-6, "b", 3)



def test_the_oracle_tolerance_itself_may_be_given_and_says_where_it_came_from() -> None:
    ceiling = agreement_tolerance("float32")
    tol = consistency_tolerance("vllm", "float32", ceiling)
    assert (tol.value, tol.source) == (ceiling, "given on the command line")


def test_the_sources_name_the_engine_dtype_and_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consistency, "MEASURED_SPREAD", {("vllm", "float32"): 2.5e-6})
    assert consistency_tolerance("vllm", "float32").source == f"{MARGIN:g} x the spread measured on vllm in float32 (2.5e-06)"
    assert consistency_tolerance("mine", "bfloat16").source.endswith("no spread measured for mine in bfloat16")
    assert consistency_tolerance(None, "float32").source.endswith("no spread measured for this engine in float32")
