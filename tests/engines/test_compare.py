"""The self-consistency checker (``engines.verdicts.compare``): what it lets through and what it reports.

Every expected verdict follows from the numbers written in the test and the rule in the module's
docstring: logprobs of a token both runs report agree within ``tol``; a greedy flip is accepted
only at a near-tie, after which nothing more is compared."""

from __future__ import annotations

from infer_ref.conformance.engines.protocol import EngineOutput, TokenLogprobs
from infer_ref.conformance.engines.verdicts.compare import (
    compare_outputs,
    compare_prompt_logprobs,
    largest_difference,
)

TOL = 1e-4


def _step(token: int, logprob: float, *others: tuple[int, float]) -> TokenLogprobs:
    return TokenLogprobs(token, logprob, ((token, logprob), *others))


def _output(*steps: TokenLogprobs, prompt: tuple[TokenLogprobs | None, ...] | None = None) -> EngineOutput:
    return EngineOutput(tuple(s.token for s in steps), "", steps, "length", prompt)


def test_identical_runs_are_consistent() -> None:
    run = _output(_step(5, -0.1, (6, -2.0)), _step(7, -0.3, (8, -1.5)))
    assert compare_outputs(run, run, TOL) == []


def test_logprob_within_tolerance_passes_and_beyond_fails() -> None:
    a = _output(_step(5, -0.1, (6, -2.0)))
    inside = _output(_step(5, -0.1 + TOL / 2, (6, -2.0)))
    outside = _output(_step(5, -0.1, (6, -2.0 + 3 * TOL)))  # an alternative's logprob moved
    assert compare_outputs(a, inside, TOL) == []
    [problem] = compare_outputs(a, outside, TOL)
    assert "step 0: token 6" in problem


def test_flip_at_a_near_tie_is_accepted_and_ends_the_comparison() -> None:
    # Step 0: tokens 5 and 6 are TOL/2 apart in the first run's list: rounding may flip them. The
    # steps after it have other contexts, so their disagreement is not reported.
    a = _output(_step(5, -0.69, (6, -0.69 - TOL / 2)), _step(1, -0.1))
    b = _output(_step(6, -0.69, (5, -0.69 - TOL / 4)), _step(2, -5.0))
    assert compare_outputs(a, b, TOL) == []


def test_flip_without_a_near_tie_is_reported() -> None:
    a = _output(_step(5, -0.1, (6, -2.5)))
    b = _output(_step(6, -0.1, (5, -2.5)))
    problems = compare_outputs(a, b, TOL)
    assert any("tokens 5 vs 6 and no near-tie" in p for p in problems), problems


def test_flip_to_a_token_outside_the_top_list_is_reported() -> None:
    a = _output(_step(5, -0.1, (6, -2.5)))
    b = _output(_step(9, -0.1))
    assert any("no near-tie" in p for p in compare_outputs(a, b, TOL))


def test_flip_without_alternatives_judged_by_the_chosen_logprobs() -> None:
    # An engine that returns no top list: each chosen logprob is its run's maximum, so a rounding
    # flip leaves the two within tol of each other; a wrong block moves them apart.
    a = _output(TokenLogprobs(5, -0.69, ()))
    tied = _output(TokenLogprobs(6, -0.69 - TOL / 2, ()))
    apart = _output(TokenLogprobs(6, -0.2, ()))
    assert compare_outputs(a, tied, TOL) == []
    assert any("no near-tie" in p for p in compare_outputs(a, apart, TOL))


def test_lengths_that_differ_after_equal_tokens_are_reported() -> None:
    a = _output(_step(5, -0.1), _step(7, -0.2))
    b = _output(_step(5, -0.1))
    assert any("lengths 2 vs 1" in p for p in compare_outputs(a, b, TOL))


def test_prompt_logprobs_compared_position_by_position() -> None:
    a = (None, _step(3, -1.0, (4, -1.5)), _step(9, -0.5))
    moved = (None, _step(3, -1.0 + 2 * TOL, (4, -1.5)), _step(9, -0.5))
    assert compare_prompt_logprobs(a, a, TOL) == []
    [problem] = compare_prompt_logprobs(a, moved, TOL)
    assert "prompt position 1: token 3" in problem
    assert compare_prompt_logprobs(a, a[:2], TOL) == ["prompt logprobs: 3 vs 2 positions"]
    assert compare_prompt_logprobs(a, (_step(1, -0.1), *a[1:]), TOL) == ["prompt position 0: one run has logprobs, the other none"]
    assert compare_prompt_logprobs(a, None, TOL) == []  # one run was not asked for them


def test_prompt_logprobs_still_judged_after_a_generated_flip() -> None:
    # Prompt logprobs do not depend on what was generated: a near-tie flip ends the comparison of
    # the generated steps only.
    prompt = (None, _step(3, -1.0))
    a = _output(_step(5, -0.69, (6, -0.69 - TOL / 2)), prompt=prompt)
    b = _output(_step(6, -0.69, (5, -0.69)), prompt=(None, _step(3, -1.0 + 3 * TOL)))
    [problem] = compare_outputs(a, b, TOL)
    assert problem.startswith("prompt position 1: token 3")


def test_largest_difference_over_what_both_runs_judge() -> None:
    # Step 0 differs by 3e-5 on token 6, step 1 by 5e-5 on the chosen token 7; the prompt by 2e-5.
    # After the flip at step 2 nothing counts, however far apart.
    a = _output(_step(5, -0.1, (6, -2.0)), _step(7, -0.3), _step(1, -0.69, (2, -0.69)), _step(4, -1.0),
                prompt=(None, _step(3, -1.0)))  # fmt: skip
    b = _output(_step(5, -0.1, (6, -2.0 + 3e-5)), _step(7, -0.3 - 5e-5), _step(2, -0.69, (1, -0.69)), _step(9, -7.0),
                prompt=(None, _step(3, -1.0 + 2e-5)))  # fmt: skip
    assert abs(largest_difference(a, b) - 5e-5) < 1e-12
    assert largest_difference(a, a) == 0.0


# Edges of each decision, with numbers exactly representable in binary so "equal to the bound" is exact.


def test_a_difference_equal_to_the_tolerance_is_inside_it() -> None:
    a = _output(_step(5, -1.0))
    b = _output(_step(5, -1.5))
    assert compare_outputs(a, b, 0.5) == []
    assert compare_outputs(a, b, 0.25) != []


def test_a_flip_whose_gap_equals_the_tolerance_is_a_near_tie() -> None:
    # Listed alternatives: the second run's token is 0.5 below the first's in the first run's list.
    a = _output(_step(1, -1.0, (2, -1.5)))
    b = _output(_step(2, -1.0, (1, -1.5)))
    assert compare_outputs(a, b, 0.5) == []
    # No alternatives listed: the two chosen logprobs, each its run's maximum, are 0.5 apart.
    assert compare_outputs(_output(TokenLogprobs(1, -1.0, ())), _output(TokenLogprobs(2, -1.5, ())), 0.5) == []


def test_an_early_disagreement_is_kept_when_later_steps_agree() -> None:
    a = _output(_step(5, -1.0), _step(6, -1.0))
    b = _output(_step(5, -2.0), _step(6, -1.0))
    [problem] = compare_outputs(a, b, 0.5)
    assert problem.startswith("step 0: token 5")


def test_a_flip_without_near_tie_names_the_first_three_alternatives() -> None:
    a = _output(_step(1, -0.5, (2, -1.0), (3, -2.0), (4, -3.0)))
    b = _output(_step(9, -0.5))
    [problem] = compare_outputs(a, b, 0.25)
    assert problem.endswith("(first run's top: 1: -0.5000, 2: -1.0000, 3: -2.0000)")


def test_largest_difference_of_nothing_shared_is_zero() -> None:
    assert largest_difference(_output(), _output()) == 0.0


def test_largest_difference_counts_prompt_positions() -> None:
    a = _output(_step(5, -1.0), prompt=(None, _step(3, -2.0)))
    b = _output(_step(5, -1.0), prompt=(None, _step(3, -2.75)))
    assert largest_difference(a, b) == 0.75


def test_largest_difference_skips_prompt_logprobs_one_run_lacks_or_counts_differently() -> None:
    a = _output(_step(5, -1.0), prompt=(None, _step(3, -2.0)))
    b = _output(_step(5, -1.25), prompt=(None, _step(3, -2.0), _step(4, -9.0)))
    assert largest_difference(a, b) == 0.25
    assert largest_difference(_output(_step(5, -1.0)), b) == 0.25
    assert largest_difference(b, _output(_step(5, -1.0))) == 0.25
