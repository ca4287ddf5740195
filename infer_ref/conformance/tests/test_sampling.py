"""Sampler properties against transformers' logits processors (the oracle for every warper chain).

``sample_probs`` must give, in float64, exactly the support and the probabilities that
transformers' ``RepetitionPenaltyLogitsProcessor`` -> ``TemperatureLogitsWarper`` ->
``TopKLogitsWarper`` -> ``TopPLogitsWarper`` -> softmax give (the order of ``generate``), for any
combination, with ties at the top-k / top-p boundary drawn on purpose. ``sample`` must draw from
that distribution: never outside the support, and with frequencies that pass a chi-square test
whose false-alarm rate is stated below.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_close, fail
from infer_ref.conformance.interface.adapter import Adapter, SamplerSpec
from infer_ref.conformance.oracles.transformers_fp64 import transformers_available

pytestmark = pytest.mark.skipif(not transformers_available(), reason="needs transformers (the oracle)")

PROB_ATOL = 1e-12  # float64 softmax of the same filtered logits: agreement to rounding
DRAWS = 3000
# Per example, a correct sampler fails the frequency test with probability FALSE_ALARM (the
# chi-square p-value threshold). The ci profile draws 25 examples per run: a false alarm in fewer
# than 1 of 40,000 runs, and derandomized, so a failure reproduces.
FALSE_ALARM = 1e-6


def transformers_probs(logits: torch.Tensor, context: list[int], spec: SamplerSpec) -> torch.Tensor:
    """Float64 ``[V]``: transformers' processors in ``generate``'s order, then softmax."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain: list[Any] = []
    if spec.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(spec.repetition_penalty))
    chain.append(TemperatureLogitsWarper(spec.temperature))
    if spec.top_k is not None:
        chain.append(TopKLogitsWarper(spec.top_k))
    if spec.top_p is not None:
        chain.append(TopPLogitsWarper(spec.top_p))
    scores = LogitsProcessorList(chain)(torch.tensor([context]), logits.double()[None, :].clone())  # type: ignore[arg-type]
    return torch.softmax(scores, dim=-1)[0]


def _params(logits: torch.Tensor, context: list[int], spec: SamplerSpec) -> dict[str, Any]:
    return {"logits": [round(float(v), 4) for v in logits], "context": context, "spec": spec}


@pytest.mark.ir_requires("sampler")
@given(data=st.data())
def test_sampler_probabilities_are_transformers_processors(ir_adapter: Adapter, data: st.DataObject) -> None:
    """The distribution the sampler draws from has exactly transformers' support and, in float64,
    its probabilities, for every combination of temperature, top-k, top-p and repetition penalty.

    Guards: *sampling warpers in the wrong order* (top-p before temperature, penalty after it),
    *top-k / top-p support not transformers'* (ties at the boundary dropped or kept differently).
    """
    logits = data.draw(irst.sampler_logits(), label="logits")
    spec = data.draw(irst.sampler_specs(logits.numel()), label="spec")
    context = data.draw(irst.sampler_contexts(logits.numel()), label="context")
    expected = transformers_probs(logits, context, spec)
    assert ir_adapter.sample_probs is not None
    actual = ir_adapter.sample_probs(logits.clone(), list(context), spec)
    params = _params(logits, context, spec)
    kept, want = (actual > 0).nonzero().flatten().tolist(), (expected > 0).nonzero().flatten().tolist()
    if kept != want:
        fail(
            f"support after the warpers: {len(kept)} tokens kept, transformers keeps {len(want)}",
            details=[f"  kept only here: {sorted(set(kept) - set(want))}", f"  kept only by transformers: {sorted(set(want) - set(kept))}"],
            params=params,
        )
    assert_close(actual.double(), expected, what="sampling probabilities vs transformers' processors (float64)", atol=PROB_ATOL, rtol=0, params=params)


# Ties at the boundaries, by construction: logits 2, 2, 1, 1, 1, 0 (softmax 0.30, 0.30, 0.11 x3, 0.04).
TIED = [2.0, 2.0, 1.0, 1.0, 1.0, 0.0]
# One warper at temperature 1 without a penalty: no order to get wrong, so only the support can differ.
TIE_CASES = [
    pytest.param(SamplerSpec(top_k=3), id="top_k=3 cuts inside the three tied 1.0s"),
    pytest.param(SamplerSpec(top_k=1), id="top_k=1 with two tied maxima"),
    pytest.param(SamplerSpec(top_p=0.65), id="top_p reached inside the tied 1.0s"),
]


def check_tied_support(adapter: Adapter, spec: SamplerSpec) -> None:
    """The support and the float64 probabilities of ``TIED`` under ``spec`` are transformers'."""
    logits = torch.tensor(TIED, dtype=torch.float64)
    expected = transformers_probs(logits, [5], spec)
    assert adapter.sample_probs is not None
    actual = adapter.sample_probs(logits.clone(), [5], spec)
    params = _params(logits, [5], spec)
    if (actual > 0).tolist() != (expected > 0).tolist():
        fail(f"support {(actual > 0).int().tolist()}, transformers' {(expected > 0).int().tolist()}", params=params)
    assert_close(actual.double(), expected, what="tied-boundary probabilities vs transformers", atol=PROB_ATOL, rtol=0, params=params)


@pytest.mark.ir_requires("sampler")
@pytest.mark.parametrize("spec", TIE_CASES)
def test_ties_at_the_top_k_and_top_p_boundary_keep_transformers_support(ir_adapter: Adapter, spec: SamplerSpec) -> None:
    """Tokens tied with the k-th logit stay (transformers keeps every logit >= the k-th); at the
    top-p cut the support equals transformers'. One warper at temperature 1, no penalty: the order
    of the warpers cannot show here, so a failure is the support's alone.

    Guards: *top-k / top-p support not transformers'*.
    """
    check_tied_support(ir_adapter, spec)


@pytest.mark.ir_requires("sampler")
def test_ties_after_temperature_at_both_cuts_keep_transformers_support(ir_adapter: Adapter) -> None:
    """All three warpers at temperature 0.5, ties at the top-k and at the top-p cut.

    Guards: *top-k / top-p support not transformers'*, *sampling warpers in the wrong order* (the
    top-p cut moves with the temperature).
    """
    check_tied_support(ir_adapter, SamplerSpec(temperature=0.5, top_k=4, top_p=0.9))


# Logits whose top-p cut moves with the temperature. Softmax at T=1: 0.557, 0.205, 0.124, 0.075,
# 0.028, 0.010, so top_p=0.8 keeps 3 tokens; at T=0.5 the first alone holds 0.829 (1 token kept),
# at T=2 the first four are needed (0.356 + 0.216 + 0.168 + 0.131). Checked against transformers below.
MOVING_CUT = [2.0, 1.0, 0.5, 0.0, -1.0, -2.0]
FOLD_CASES = [
    pytest.param(SamplerSpec(temperature=0.5, top_p=0.8), id="T=0.5 top_p=0.8"),
    pytest.param(SamplerSpec(temperature=2.0, top_p=0.8), id="T=2 top_p=0.8"),
    pytest.param(SamplerSpec(temperature=2.0, top_k=5, top_p=0.8), id="T=2 top_k=5 top_p=0.8"),
    pytest.param(SamplerSpec(temperature=0.5, top_p=0.8, repetition_penalty=1.3), id="T=0.5 top_p=0.8 penalty=1.3"),
]


@pytest.mark.ir_requires("sampler")
@pytest.mark.parametrize("spec", FOLD_CASES)
def test_temperature_folded_into_the_logits_changes_nothing(ir_adapter: Adapter, spec: SamplerSpec) -> None:
    """The sampler at temperature T equals the same sampler at temperature 1 fed ``logits / T``:
    transformers divides by T before top-k and top-p (the repetition penalty, a division or a
    multiplication, commutes with it). The implementation is compared with itself, so a support rule
    of its own (ties kept or dropped) is the same on both sides and cannot fail this test; the cases
    are ones whose top-p cut moves with T, so filtering before the temperature does.

    Guards: *sampling warpers in the wrong order*.
    """
    logits = torch.tensor(MOVING_CUT, dtype=torch.float64)
    context = [1]
    at_one = replace(spec, temperature=1.0)
    moves = (transformers_probs(logits, context, spec) > 0).tolist() != (transformers_probs(logits, context, at_one) > 0).tolist()
    assert moves, f"the case does not move transformers' cut with the temperature: it cannot tell the order ({spec})"
    assert ir_adapter.sample_probs is not None
    actual = ir_adapter.sample_probs(logits.clone(), list(context), spec)
    folded = ir_adapter.sample_probs(logits / spec.temperature, list(context), at_one)
    params = _params(logits, context, spec)
    if (actual > 0).tolist() != (folded > 0).tolist():
        fail(
            f"support at temperature {spec.temperature}: {(actual > 0).int().tolist()}; with the temperature folded into the logits: "
            f"{(folded > 0).int().tolist()} (the filters ran before the temperature)",
            params=params,
        )
    assert_close(actual.double(), folded.double(), what="probabilities at T vs at 1 on logits / T", atol=PROB_ATOL, rtol=0, params=params)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of ``counts`` against ``probs``; bins expected below 5 are pooled.
    p = Q(k/2, x/2), the regularised upper incomplete gamma function, with k = bins - 1."""
    n = float(counts.sum())
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if exp.numel() < 2:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(torch.special.gammaincc(torch.tensor((exp.numel() - 1) / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def check_draws(draws: list[int], expected: torch.Tensor, against: str, params: dict[str, Any]) -> None:
    """``DRAWS`` draws, none outside the support of ``expected`` (float64 ``[V]``), with frequencies
    that pass the chi-square test against it."""
    if len(draws) != DRAWS:
        fail(f"sample returned {len(draws)} draws, asked for {DRAWS}", params=params)
    outside = sorted({t for t in draws if not 0 <= t < expected.numel() or expected[t] == 0})
    if outside:
        fail(f"draws outside the support of {against}: tokens {outside}", params=params)
    counts = torch.bincount(torch.tensor(draws), minlength=expected.numel())
    p = chi_square_p_value(counts, expected)
    if p < FALSE_ALARM:
        worst = int(((counts.double() - expected * DRAWS).abs()).argmax())
        fail(
            f"draw frequencies do not follow {against}: chi-square p = {p:.2e} < {FALSE_ALARM}",
            details=[f"  token {worst}: drawn {int(counts[worst])} times of {DRAWS}, expected {float(expected[worst]) * DRAWS:.1f}"],
            params=params,
        )
    assert math.isfinite(p)


@pytest.mark.ir_requires("sampler.draw")
@given(data=st.data())
def test_seeded_draws_follow_the_filtered_distribution(ir_adapter: Adapter, data: st.DataObject) -> None:
    """3000 seeded draws never leave transformers' support, and their frequencies pass a chi-square
    test against transformers' probabilities (false alarm 1e-6 per example).

    Guards: *sampled draws not from the filtered distribution* (a draw that ignores the filter, or
    a biased exponential race), and the warper bugs as users meet them: *sampling warpers in the
    wrong order*, *top-k / top-p support not transformers'*.
    """
    logits = data.draw(irst.sampler_logits(min_vocab=4, max_vocab=24), label="logits")
    spec = data.draw(irst.sampler_specs(logits.numel()), label="spec")
    context = data.draw(irst.sampler_contexts(logits.numel()), label="context")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    expected = transformers_probs(logits, context, spec)
    assert ir_adapter.sample is not None
    draws = ir_adapter.sample(logits.clone(), list(context), spec, seed, DRAWS)
    params = {**_params(logits, context, spec), "seed": seed}
    check_draws(draws, expected, "transformers' probabilities", params)


# Cases for the draws alone: no filter, each filter, a penalty, and ties at the top-k cut.
OWN_DRAW_CASES = [
    pytest.param([1.0, 0.5, 0.0, -0.5, 0.2, 0.8], SamplerSpec(), id="no filter"),
    pytest.param([1.0, 0.5, 0.0, -0.5, 0.2, 0.8], SamplerSpec(temperature=0.7, top_k=4), id="T=0.7 top_k=4"),
    pytest.param([1.0, 0.5, 0.0, -0.5, 0.2, 0.8], SamplerSpec(temperature=1.5, top_p=0.7, repetition_penalty=1.3), id="T=1.5 top_p=0.7 penalty"),
    pytest.param(TIED, SamplerSpec(top_k=3), id="TIED top_k=3"),
]


@pytest.mark.ir_requires("sampler", "sampler.draw")
@pytest.mark.parametrize(("logits", "spec"), OWN_DRAW_CASES)
def test_seeded_draws_follow_the_samplers_own_probabilities(ir_adapter: Adapter, logits: list[float], spec: SamplerSpec) -> None:
    """3000 seeded draws stay inside the support the implementation's own ``sample_probs`` reports
    and pass the chi-square test against those probabilities. The draws are checked against the
    distribution the implementation says it draws from, whatever that is: a wrong warper order or
    support is the same on both sides and cannot fail this test.

    Guards: *sampled draws not from the filtered distribution*.
    """
    tensor = torch.tensor(logits, dtype=torch.float64)
    context = [1]
    assert ir_adapter.sample_probs is not None and ir_adapter.sample is not None
    own = ir_adapter.sample_probs(tensor.clone(), list(context), spec).double()
    draws = ir_adapter.sample(tensor.clone(), list(context), spec, 1234, DRAWS)
    check_draws(draws, own, "the sampler's own probabilities", _params(tensor, context, spec))
