"""The signed statistics of the low-precision verdict, each against data whose answer is stated
arithmetic: a known temperature gives its slope, sign-shuffled noise a slope within its standard
error of 0 (and the standard error matches the spread of the slope over repeats), cluster-robust
errors ignore duplicated positions, a linear KL trend gives its ratio, and the judgement never
fails an engine nearer the oracle than the centre."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from infer_ref.conformance.engines.protocol import TokenLogprobs
from infer_ref.conformance.engines.verdicts.signed_statistics import (
    Calibration,
    Estimate,
    SlopeRow,
    engine_signed_statistics,
    judge,
    judge_trend,
    late_early_ratio,
    mean_with_se,
    temperature_slope,
)


def _logits(positions: int, vocab: int, seed: int) -> torch.Tensor:
    return (
        torch.randn(positions, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    )


def _signs(shape: torch.Size, seed: int) -> torch.Tensor:
    """+1 or -1 per entry, each a fair coin."""
    return (
        torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 - 1
    )


def _rows(oracle: torch.Tensor, engine: torch.Tensor, k: int = 6, per_cluster: int = 1) -> list[SlopeRow]:
    """The engine's top-k tokens at each position, as a tier engine returns them."""
    rows = []
    for i in range(oracle.shape[0]):
        ids = engine[i].topk(k).indices
        rows.append(SlopeRow(i // per_cluster, oracle[i, ids], engine[i, ids]))
    return rows


@pytest.mark.parametrize("temperature", [0.99, 1.0, 1.004, 1.5])
def test_logits_scaled_by_a_temperature_give_that_slope_minus_one(temperature: float) -> None:
    # lp_eng = s*z - lse(s*z), lp_or = z - lse(z): centred per position, the error is (s - 1) times
    # the centred oracle logprob exactly, whatever tokens are returned.
    z = _logits(50, 40, 0)
    oracle, engine = z.log_softmax(-1), (temperature * z).log_softmax(-1)
    slope = temperature_slope(_rows(oracle, engine))
    assert slope.value == pytest.approx(temperature - 1, abs=1e-12)
    assert slope.se == pytest.approx(0.0, abs=1e-12)  # no residual: the fit is exact


def test_sign_shuffled_noise_gives_a_slope_of_zero_within_its_standard_error() -> None:
    # Noise of one size whose sign is a coin flip per token: no direction, so B is 0 in expectation;
    # over 300 repeats the mean SE must match the spread of B (the SE is right), and |B| < 4 SE always.
    z = _logits(60, 30, 1)
    oracle = z.log_softmax(-1)
    slopes, ses = [], []
    for repeat in range(300):
        signs = _signs(oracle.shape, 1000 + repeat)
        engine = oracle + 1e-3 * signs
        est = temperature_slope(_rows(oracle, engine))
        slopes.append(est.value)
        ses.append(est.se)
        assert abs(est.value) < 4 * est.se
    spread = statistics.pstdev(slopes)
    assert statistics.mean(ses) == pytest.approx(spread, rel=0.15)
    assert abs(statistics.mean(slopes)) < 4 * spread / math.sqrt(len(slopes))


def test_a_temperature_under_noise_is_resolved_by_its_t() -> None:
    # A 2^-9 temperature (one bf16 rounding of the final norm) under sign noise of 4x its mean effect.
    z = _logits(400, 30, 3)
    oracle = z.log_softmax(-1)
    signs = _signs(oracle.shape, 4)
    engine = ((1 + 2**-9) * z).log_softmax(-1) + 4 * 2**-9 * signs
    est = temperature_slope(_rows(oracle, engine))
    assert abs(est.value - 2**-9) < 4 * est.se
    assert est.t_from(0.0) > 5


def test_slope_standard_error_counts_clusters_not_positions() -> None:
    # Each position duplicated inside its own cluster: the slope is unchanged and so is its SE (the
    # copies carry no new information); a per-position SE would have shrunk by sqrt(2).
    z = _logits(40, 20, 5)
    oracle = z.log_softmax(-1)
    signs = _signs(oracle.shape, 6)
    engine = oracle + 1e-3 * signs
    once = temperature_slope(_rows(oracle, engine))
    twice = temperature_slope(
        _rows(oracle.repeat_interleave(2, 0), engine.repeat_interleave(2, 0), per_cluster=2)
    )
    assert twice.value == pytest.approx(once.value, rel=1e-12)
    assert twice.se == pytest.approx(once.se, rel=1e-12)


def test_mean_with_se_by_stated_arithmetic() -> None:
    # 1, 2, 3, 4 each its own cluster: mean 2.5, SE sqrt(sum (v - mean)^2) / n = sqrt(5) / 4.
    est = mean_with_se([1.0, 2.0, 3.0, 4.0], [0, 1, 2, 3])
    assert (est.value, est.se) == (pytest.approx(2.5), pytest.approx(math.sqrt(5) / 4))
    # Two clusters {1, 2} and {3, 4}: cluster sums of deviations -2 and +2: SE sqrt(8) / 4.
    assert mean_with_se([1.0, 2.0, 3.0, 4.0], ["a", "a", "b", "b"]).se == pytest.approx(math.sqrt(8) / 4)


def test_late_early_ratio_of_a_linear_kl_trend() -> None:
    # KL = 1 + p/100 at positions 0..299: the first third (p < 99.67) is 0..99, mean 1.495; the last
    # (p > 199.33) 200..299, mean 3.495: ratio 3.495 / 1.495. A constant KL gives 1 with SE 0.
    positions = list(range(300))
    est = late_early_ratio([1 + p / 100 for p in positions], positions, [p // 10 for p in positions])
    assert est.value == pytest.approx(3.495 / 1.495, rel=1e-12)
    assert est.se > 0
    flat = late_early_ratio([2.0] * 300, positions, [p // 10 for p in positions])
    assert (flat.value, flat.se) == (pytest.approx(1.0), pytest.approx(0.0))


def test_judge_fails_a_deviation_beyond_the_margin_and_its_noise() -> None:
    # Correct engines at slopes 2e-3 +- 1e-4 (centre 2e-3, spread 1e-4).
    cal = Calibration.of([1.9e-3, 2.0e-3, 2.1e-3])
    assert cal.centre == pytest.approx(2e-3) and cal.spread == pytest.approx(1e-4)
    bug = judge(Estimate(4e-3, 5e-5), cal)  # 20 spreads away, t 40, further from 0 than the centre
    assert bug.deviates and bug.spreads == pytest.approx(20) and bug.t == pytest.approx(40)
    # Past the exact value: -4e-4 is 24 spreads from the centre, and judged by its 4 spreads (t -8) from 0.
    past = judge(Estimate(-4e-4, 5e-5), cal)
    assert past.deviates and past.spreads == pytest.approx(-24)
    assert not judge(Estimate(-2e-4, 5e-5), cal).deviates  # 2 spreads past 0: inside the margin
    assert not judge(Estimate(2.25e-3, 1e-5), cal).deviates  # 2.5 spreads: inside the margin
    assert not judge(Estimate(3e-3, 5e-4), cal).deviates  # 10 spreads but t 2: noise could do it


def test_judge_never_fails_an_engine_more_exact_than_the_centre() -> None:
    # A float32 engine: slope ~0, 20 spreads from the centre at t -200, but nearer the oracle (0).
    cal = Calibration.of([1.9e-3, 2.0e-3, 2.1e-3])
    exact = judge(Estimate(0.0, 1e-5), cal)
    assert exact.spreads == pytest.approx(-20) and not exact.deviates
    assert not judge(Estimate(1e-3, 1e-6), cal).deviates  # halfway to exact: 10 spreads, t -1000
    # A ratio has no exact value: judged on the deviation alone.
    assert judge(Estimate(7.0, 0.2), Calibration.of([1.0, 1.1, 1.2]), exact_value=None).deviates


def test_a_kl_trend_counts_only_for_an_engine_less_exact_than_the_correct_ones() -> None:
    # Ratios of correct engines 1.0..1.2 (spread 0.1): 7.0 is 59 spreads away. With a KL mean above the
    # correct centre it deviates; a float32 engine's KL (1e-9 against 1e-4) makes its ratio noise.
    ratio, cal = Estimate(7.0, 0.2), Calibration.of([1.0, 1.1, 1.2])
    kl_cal = Calibration.of([1e-4, 1.2e-4])
    assert judge_trend(ratio, cal, Estimate(5e-4, 1e-5), kl_cal).deviates
    more_exact = judge_trend(ratio, cal, Estimate(1e-9, 1e-10), kl_cal)
    assert more_exact.spreads == pytest.approx(59) and not more_exact.deviates


def test_an_engines_reported_positions_give_its_temperature_and_signed_error() -> None:
    # An engine whose logits are the oracle's times 1.01, reporting its top-5 and the chosen token
    # per position, as the tier receives them: slope 0.01 exactly; the chosen error is the mean of
    # lp_eng - lp_or over the chosen tokens, computed here directly.
    z = _logits(30, 50, 8)
    oracle, engine = z.log_softmax(-1), (1.01 * z).log_softmax(-1)
    chosen = torch.randint(0, 50, (30,), generator=torch.Generator().manual_seed(9))
    reported = []
    for p in range(30):
        top = tuple((int(t), float(engine[p, t])) for t in engine[p].topk(5).indices)
        reported.append((p // 10, TokenLogprobs(int(chosen[p]), float(engine[p, chosen[p]]), top), oracle[p]))
    out = engine_signed_statistics(reported)
    assert out["slope"] == pytest.approx(0.01, abs=1e-12) and out["slope_se"] == pytest.approx(0.0, abs=1e-12)
    errors = [float(engine[p, chosen[p]] - oracle[p, chosen[p]]) for p in range(30)]
    assert out["chosen_error"] == pytest.approx(sum(errors) / 30, rel=1e-12)
    assert out["chosen_error_se"] == pytest.approx(
        mean_with_se(errors, [p // 10 for p in range(30)]).se, rel=1e-12
    )
    # An engine that returns the chosen token alone: no slope to compute, the signed error still.
    alone = engine_signed_statistics(
        [(c, TokenLogprobs(e.token, e.logprob, ()), row) for c, e, row in reported]
    )
    assert (
        alone["slope"] is None and alone["slope_se"] is None and alone["chosen_error"] == out["chosen_error"]
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: temperature_slope([]), "at least one position"),
        (lambda: temperature_slope([SlopeRow(0, torch.zeros(3), torch.zeros(4))]), "one shape"),
        (lambda: temperature_slope([SlopeRow(0, torch.zeros(3), torch.zeros(3))]), "equal at every position"),
        (lambda: mean_with_se([1.0], [0, 1]), "1 values but 2 cluster labels"),
        (lambda: mean_with_se([], []), "at least one value"),
        (lambda: late_early_ratio([1.0, 2.0], [0, 1], [0]), "2 KL values, 2 positions and 1 cluster labels"),
        (lambda: late_early_ratio([0.0, 0.0, 1.0], [0, 1, 2], [0, 0, 0]), "first third is not positive"),
        (lambda: late_early_ratio([1.0], [5], [0]), "too little"),
        (lambda: Calibration.of([]), "at least one correct engine"),
    ],
)
def test_bad_inputs_are_refused_by_name(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_the_report_shows_each_signed_statistic_with_its_standard_error() -> None:
    from infer_ref.conformance.report import Report

    report = Report(
        impl="--ir-engine=x",
        adapter="engine tier:",
        version="x",
        device="cpu",
        dtype="bfloat16",
        capabilities={},
    )
    row = {"test": "t", "checkpoint": "llama-tiny", "positions": 10, "kl_mean": 1e-3, "kl_median": 1e-3, "kl_p99": 1e-2,
           "kl_max": 1e-2, "logprob_error_max": 0.1, "same_top": 1.0, "exceeded": [],
           "slope": 2.1e-3, "slope_se": 1.5e-4, "chosen_error": -3e-3, "chosen_error_se": 4e-4}  # fmt: skip
    report.distributions = [row, {**row, "checkpoint": "older", "slope": None, "slope_se": None}]
    table = [line for line in report.to_markdown().splitlines() if line.startswith("| t |")]
    assert "| +2.10e-03 ± 1.5e-04 | -3.00e-03 ± 4.0e-04 |" in table[0]
    assert "| 100.0% |  | -3.00e-03 ± 4.0e-04 |" in table[1]  # no slope computed: an empty cell, not a number


def test_an_engine_returning_the_chosen_token_alone_is_measured_on_its_signed_error() -> None:
    """run_statistics(chosen_only=True): the chosen token's signed error alone (here every chosen
    logprob 0.1 above the oracle's: 0.1 with SE 0); without it, the slope's need of two returned
    tokens is named (the engine's answers cannot give the calibrated statistics)."""
    from infer_ref.conformance.engines.numerics_workload import run_statistics

    rows = torch.log_softmax(_logits(12, 9, seed=3), dim=-1)  # [12 positions, V 9]
    positions = [
        (p // 4, p, TokenLogprobs(p % 9, float(rows[p, p % 9]) + 0.1, ()), rows[p]) for p in range(12)
    ]
    stats = run_statistics(positions, long=False, chosen_only=True)
    assert set(stats) == {"chosen_error"}
    assert stats["chosen_error"].value == pytest.approx(0.1, abs=1e-12)
    assert stats["chosen_error"].se == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="slope needs two returned tokens"):
        run_statistics(positions, long=False)
