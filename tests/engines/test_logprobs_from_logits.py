"""Top-k logprobs from logits (``engines.logprobs``), against log-softmax written out in float64 math.

The logits are exactly representable in float32, so the oracle's only rounding is float64's: a
log-softmax taken in float32 would be off by about 1e-7, far beyond the 1e-12 allowed here."""

from __future__ import annotations

import math

import pytest
import torch

from infer_ref.conformance.engines.logprobs import prompt_logprobs_from, token_logprobs

LOGITS = (0.0, 1.0, 0.5, -1.0)  # from the most likely: 1, 2, 0, 3


def _oracle(logits: tuple[float, ...]) -> list[float]:
    log_sum = math.log(sum(math.exp(x) for x in logits))
    return [x - log_sum for x in logits]


def test_the_token_logprob_and_the_top_k_from_the_most_likely_down() -> None:
    expected = _oracle(LOGITS)
    entry = token_logprobs(torch.tensor(LOGITS, dtype=torch.float32), 3, k=2)
    assert entry.token == 3 and entry.logprob == pytest.approx(expected[3], abs=1e-12)
    assert [t for t, _ in entry.top] == [1, 2]
    assert [lp for _, lp in entry.top] == pytest.approx([expected[1], expected[2]], abs=1e-12)


def test_a_k_beyond_the_vocabulary_gives_every_token() -> None:
    entry = token_logprobs(torch.tensor(LOGITS, dtype=torch.float32), 0, k=10)
    assert [t for t, _ in entry.top] == [1, 2, 0, 3]


def test_prompt_logprobs_score_each_next_prompt_token_with_its_row() -> None:
    rows = (LOGITS, (2.0, 0.0, 0.0, 0.0))  # row i predicts prompt token i + 1
    prompt = (7, 3, 0)
    entries = prompt_logprobs_from(torch.tensor(rows, dtype=torch.float32), prompt, k=1)
    assert len(entries) == 3 and entries[0] is None
    for position, entry in enumerate(entries[1:], start=1):
        assert entry is not None
        expected = _oracle(rows[position - 1])
        assert entry.token == prompt[position]
        assert entry.logprob == pytest.approx(expected[prompt[position]], abs=1e-12)
        assert entry.top == ((max(range(4), key=lambda t: expected[t]), pytest.approx(max(expected), abs=1e-12)),)


def test_tied_logprobs_come_lower_id_first() -> None:
    """Ties in the top k are ordered by id, lower first, whatever order ``torch.topk`` returns them in
    (it gives [1, 2] for the top 2 of [0, 1, 0, -1]): the oracle's list must not depend on it."""
    entry = token_logprobs(torch.tensor((0.0, 1.0, 0.0, -1.0, 0.0), dtype=torch.float32), 0, k=4)
    assert [t for t, _ in entry.top] == [1, 0, 2, 4]


def test_ties_list_the_lower_id_first_over_a_vocabulary_of_real_size() -> None:
    """128 equal logits but one: the best, then the tied rest in id order. An unstable sort keeps the
    tie order only on short rows (up to about 16 here), so a short row cannot show it."""
    logits = torch.zeros(128)
    logits[64] = 1.0
    entry = token_logprobs(logits, 0, k=5)
    assert [t for t, _ in entry.top] == [64, 0, 1, 2, 3]
    assert [lp for _, lp in entry.top][1:] == pytest.approx([-math.log(127 + math.e)] * 4, abs=1e-12)
