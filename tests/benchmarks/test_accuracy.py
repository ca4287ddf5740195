"""The teacher-forced agreement metrics of benchmarks/accuracy.py against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.accuracy import (
    REFERENCE_RESOLUTION,
    Agreement,
    agreement,
    kl_divergence,
    log_probs,
    token_logprob_delta,
    within_margin,
)


def _lp(*probs: float) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_kl_of_two_hand_computed_distributions() -> None:
    # KL([1/2, 1/2] || [1/4, 3/4]) = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
    kl = kl_divergence(_lp(0.5, 0.5), _lp(0.25, 0.75))
    assert float(kl) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
    # and the other direction: 1/4 ln(1/2) + 3/4 ln(3/2)
    assert float(kl_divergence(_lp(0.25, 0.75), _lp(0.5, 0.5))) == pytest.approx(
        0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-12)


def test_kl_of_a_row_with_itself_is_zero_per_row() -> None:
    rows = log_probs(torch.randn(3, 11, generator=torch.Generator().manual_seed(0)))
    assert kl_divergence(rows, rows).tolist() == [0.0, 0.0, 0.0]


def test_shifted_logits_give_the_same_log_probs() -> None:
    logits = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    ref, path = log_probs(logits), log_probs(logits + 7.5)  # softmax ignores a constant shift
    assert float(token_logprob_delta(ref, path, torch.tensor([2])).max()) <= 1e-12
    assert float(kl_divergence(ref, path).max()) <= 1e-12


def test_logprob_delta_of_the_chosen_token() -> None:
    ref = torch.stack([_lp(0.5, 0.5), _lp(0.1, 0.9)])
    path = torch.stack([_lp(0.25, 0.75), _lp(0.1, 0.9)])
    delta = token_logprob_delta(ref, path, torch.tensor([0, 1]))
    assert delta[0].item() == pytest.approx(math.log(2), rel=1e-12)  # |ln 1/2 - ln 1/4|
    assert delta[1].item() == 0.0


def test_agreement_is_mean_kl_and_max_delta_over_steps() -> None:
    ref_logits = torch.stack([_lp(0.5, 0.5), _lp(0.5, 0.5)])  # log-probs are logits too
    path_logits = torch.stack([_lp(0.25, 0.75), _lp(0.5, 0.5)])
    result = agreement(ref_logits, path_logits, torch.tensor([1, 0]))
    assert result.steps == 2
    assert result.mean_kl == pytest.approx(0.5 * math.log(4 / 3) / 2, rel=1e-12)  # (KL_0 + 0) / 2
    assert result.max_abs_dlogprob == pytest.approx(math.log(0.75 / 0.5), rel=1e-12)  # step 0, token 1


def test_within_margin_compares_both_metrics_with_the_baseline() -> None:
    baseline = Agreement(steps=4, mean_kl=1e-3, max_abs_dlogprob=0.1)
    assert within_margin(Agreement(4, 1.2e-3, 0.12), baseline, 1.25)
    assert not within_margin(Agreement(4, 1.3e-3, 0.1), baseline, 1.25)  # KL over 1.25 x
    assert not within_margin(Agreement(4, 1e-3, 0.13), baseline, 1.25)  # Δlogprob over 1.25 x
    assert within_margin(baseline, baseline, 1.0)


def test_within_margin_does_not_rank_differences_below_the_reference_resolution() -> None:
    exact = Agreement(steps=4, mean_kl=0.0, max_abs_dlogprob=0.0)
    assert within_margin(Agreement(4, REFERENCE_RESOLUTION.mean_kl, REFERENCE_RESOLUTION.max_abs_dlogprob), exact, 1.25)
    assert not within_margin(Agreement(4, 0.0, 2 * REFERENCE_RESOLUTION.max_abs_dlogprob), exact, 1.25)


@pytest.mark.parametrize("margin", [0.9, float("nan"), float("inf")])
def test_within_margin_rejects_a_bad_margin(margin: float) -> None:
    a = Agreement(1, 0.0, 0.0)
    with pytest.raises(ValueError, match="margin must be a finite number >= 1"):
        within_margin(a, a, margin)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same shape"):
        kl_divergence(_lp(0.5, 0.5), _lp(0.2, 0.3, 0.5))
    with pytest.raises(ValueError, match="one id per row"):
        token_logprob_delta(_lp(0.5, 0.5)[None], _lp(0.5, 0.5)[None], torch.tensor([0, 1]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rows_are_an_error(bad: float) -> None:
    logits = torch.tensor([[0.0, 1.0, bad]])
    with pytest.raises(ValueError, match=r"logits must be finite; first NaN or infinity at index \[0, 2\]"):
        log_probs(logits)
    with pytest.raises(ValueError, match="must be finite"):
        agreement(torch.zeros(1, 3), logits, torch.tensor([0]))


def test_logits_passed_as_log_probs_are_an_error() -> None:
    with pytest.raises(ValueError, match="must be log-probabilities"):
        kl_divergence(torch.tensor([1.0, 2.0]), log_probs(torch.tensor([1.0, 2.0])))


def test_token_ids_out_of_range_or_not_integers_are_an_error() -> None:
    rows = _lp(0.5, 0.5)[None]
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 2\)"):
        token_logprob_delta(rows, rows, torch.tensor([2]))
    with pytest.raises(TypeError, match="int64 or int32"):
        token_logprob_delta(rows, rows, torch.tensor([0.0]))


def test_rows_must_be_floating_point_with_a_vocabulary_axis() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        log_probs(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"must be \[steps >= 1, vocab\]"):
        agreement(torch.zeros(0, 3), torch.zeros(0, 3), torch.tensor([], dtype=torch.long))
