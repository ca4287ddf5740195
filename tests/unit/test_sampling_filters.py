"""Sampling's warps on hand-made logits (values from arithmetic stated here) and the stop decision."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from infer_ref.errors import NonFiniteError
from infer_ref.results import GenerationTiming, TokenCollector, first_stop
from infer_ref.sampling import SamplingParams, apply_repetition_penalty, filter_top_k_top_p, sample_token


def test_top_p_keeps_the_smallest_set_that_reaches_it_at_the_exact_boundary() -> None:
    # Four equal tokens (0.25 each, exact in binary): 0.75 is reached by exactly three of them.
    kept = torch.isfinite(filter_top_k_top_p(torch.zeros(4), None, 0.75))
    assert int(kept.sum()) == 3
    # p = (1/8, 1/8, 1/4, 1/2): 0.5 is reached by the largest alone, 0.75 by the two largest.
    logits = torch.log(torch.tensor([1.0, 1.0, 2.0, 4.0], dtype=torch.float64))
    assert torch.isfinite(filter_top_k_top_p(logits, None, 0.5)).tolist() == [False, False, False, True]
    assert torch.isfinite(filter_top_k_top_p(logits, None, 0.75)).tolist() == [False, False, True, True]


def test_top_k_and_top_p_of_everything_keep_everything() -> None:
    logits = torch.tensor([0.5, -1.0, 3.0])
    assert torch.equal(filter_top_k_top_p(logits, 3, 1.0), logits)
    assert filter_top_k_top_p(logits, 2, None).tolist() == [0.5, float("-inf"), 3.0]


def test_top_p_of_one_keeps_a_token_whose_probability_underflows() -> None:
    # exp(-200) ~ 1e-87 is 0 in float32: its cumulative probability is 0, yet top_p = 1 keeps it.
    logits = torch.tensor([0.0, -200.0])
    assert torch.equal(filter_top_k_top_p(logits, None, 1.0), logits)


def test_top_p_of_one_is_a_valid_setting() -> None:
    assert SamplingParams(top_p=1.0).top_p == 1.0
    assert SamplingParams(top_p=1).top_p == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([2.0, -2.0, 0.5, 3.0])
    out = apply_repetition_penalty(logits, [0, 1, 1], 2.0)  # tokens 0 and 1 seen
    assert out.tolist() == [1.0, -4.0, 0.5, 3.0]
    assert logits.tolist() == [2.0, -2.0, 0.5, 3.0]  # the input is not modified


def test_repetition_penalty_without_context_changes_nothing() -> None:
    logits = torch.tensor([2.0, -2.0])
    assert torch.equal(apply_repetition_penalty(logits, [], 2.0), logits)


def test_sample_token_names_the_default_position_when_logits_are_nan() -> None:
    with pytest.raises(NonFiniteError, match="the sampled position"):
        sample_token(torch.tensor([float("nan"), 1.0]), [], SamplingParams(temperature=0.0))


def test_first_stop_is_the_earliest_occurrence_of_any_stop() -> None:
    assert first_stop("ab.cd.ef", ["."]) == 2
    assert first_stop("ab.cd!ef", ["!", "."]) == 2
    assert first_stop("abc", ["x"]) is None


class _SpecialAwareDecoder:
    """Id 0 is a special token rendered '<s>' unless skipped; id n > 0 is the letter chr(96 + n)."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return "".join("" if i == 0 and skip_special_tokens else "<s>" if i == 0 else chr(96 + i) for i in ids)


def test_collector_text_and_stops_skip_special_tokens_and_count_the_prompt() -> None:
    collector = TokenCollector([5, 6, 7], _SpecialAwareDecoder(), max_new_tokens=3, stop=["<"], eos_ids=[9])
    assert not collector.accept(0) and not collector.accept(1)  # '<s>' is special: never text, never a stop
    assert collector.accept(2)  # the limit
    timing = GenerationTiming(prefill_time_s=1.0)
    result = collector.result(timing, None)
    assert (result.text, result.finish_reason, result.prompt_tokens) == ("ab", "length", 3)
    assert result.timing is timing and result.token_ids == [0, 1, 2]

