"""The run budget of benchmarks/budget.py: what fits runs, what does not is listed; estimates from measured units."""

from __future__ import annotations

import pytest

from benchmarks.budget import Budget, DurationEstimates, Units


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_unit_runs_only_if_spent_plus_estimate_fits() -> None:
    clock = FakeClock()
    budget = Budget(60.0, clock=clock)
    clock.now += 50.0
    assert budget.allows("short", 10.0)  # 50 + 10 <= 60
    assert not budget.allows("long", 10.5)
    assert budget.skipped == [{"what": "long", "estimate_s": 10.5, "elapsed_s": 50.0, "budget_s": 60.0}]


def test_no_budget_allows_everything() -> None:
    assert Budget(None).allows("anything", 1e9)


@pytest.mark.parametrize("seconds", [0.0, -5.0, float("nan"), float("inf")])
def test_a_bad_budget_is_an_error(seconds: float) -> None:
    with pytest.raises(ValueError, match="positive finite number or None"):
        Budget(seconds)


def test_estimates_scale_the_largest_measured_size_below_linearly() -> None:
    est = DurationEstimates({"compile": 120.0})
    assert est.estimate("compile") == 120.0  # default before any measurement
    assert est.estimate("point:m:static", 1024) == 0.0  # no default for the kind
    est.record("point:m:static", 2.0, 128)
    est.record("point:m:static", 3.0, 1024)
    assert est.estimate("point:m:static", 4096) == pytest.approx(3.0 * 4096 / 1024)
    assert est.estimate("point:m:static", 512) == pytest.approx(2.0 * 512 / 128)
    assert est.estimate("point:m:static", 64) == 3.0  # smaller than any measured: the slowest measured
    est.record("compile:m", 40.0)
    est.record("compile:m", 55.0)
    assert est.estimate("compile:m") == 55.0
    assert est.estimate("compile:other") == 120.0  # default of the kind before the colon


def test_measuring_records_the_duration_of_the_body() -> None:
    est = DurationEstimates()
    with est.measuring("unit", 8):
        pass
    ((size, seconds),) = est.records["unit"]
    assert size == 8 and 0.0 <= seconds < 1.0


def test_units_run_what_fits_and_record_failures_without_raising() -> None:
    clock = FakeClock()
    units = Units("m", Budget(10.0, clock=clock), DurationEstimates({"slow": 20.0}))
    assert units.run("fits", "fast", lambda: 42) == 42
    assert units.run("too slow", "slow", lambda: 1) is None and units.last_reason == "budget"
    assert units.budget.skipped[0]["what"] == "m: too slow"

    def broken() -> int:
        raise RuntimeError("out of memory at context 16384")

    assert units.run("point", "fast", broken) is None
    assert units.last_reason == "RuntimeError: out of memory at context 16384"
    assert units.errors == ["point: RuntimeError: out of memory at context 16384"]
    assert set(units.durations) == {"fits", "point"}  # what ran, failed or not; not what was skipped
