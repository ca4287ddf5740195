"""The engine's refusals: its constructor and each malformed request set, before any work.

Every case asserts the error, the words that name the culprit and what was expected, and that the
pool is untouched; each boundary case next to it shows the largest accepted value runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from infer_ref.config import ModelConfig
from infer_ref.engine import SamplingParams
from infer_ref.engine.engine import Engine
from infer_ref.models import DecoderLM

MAX_POSITIONS = 512  # llama-tiny's max_position_embeddings
GREEDY2 = SamplingParams(temperature=0.0, max_new_tokens=2)


@pytest.mark.parametrize("bad", [True, 2.5, 0, "4"], ids=["engine-max-batch-bool", "engine-max-batch-float",
                                                          "engine-max-batch-zero", "engine-max-batch-str"])
def test_engine_refuses_a_max_batch_that_is_not_a_positive_int(llama: tuple[DecoderLM, ModelConfig], bad: Any) -> None:
    model, _ = llama
    with pytest.raises(ValueError, match=rf"max_batch must be a positive integer, got {bad!r}"):
        Engine(model, num_blocks=4, max_batch=bad)


@pytest.mark.parametrize("bad", [True, 2.5, 0, -3, "64"], ids=["budget-bool", "budget-float", "budget-zero", "budget-negative", "budget-str"])
def test_engine_refuses_a_chunk_budget_that_is_not_a_positive_int(llama: tuple[DecoderLM, ModelConfig], bad: Any) -> None:
    model, _ = llama
    with pytest.raises(ValueError, match=rf"max_num_batched_tokens must be a positive integer \(tokens per step\) or None \(whole prefills\), got {bad!r}"):
        Engine(model, num_blocks=4, max_num_batched_tokens=bad)


def test_a_one_token_budget_runs(llama: tuple[DecoderLM, ModelConfig]) -> None:
    """The smallest budget: one prompt token per step beside no decode, then one decode per step."""
    model, _ = llama
    engine = Engine(model, num_blocks=8, max_num_batched_tokens=1)
    [result] = engine.generate([[1, 2, 3]], GREEDY2)
    assert len(result.token_ids) == 2 and engine.stats.prefill_forwards == 3 and engine.stats.prefill_tokens_computed == 3


def test_engine_refuses_a_model_without_a_config() -> None:
    with pytest.raises(TypeError, match=r"\.config attribute \(a ModelConfig\)"):
        Engine(object(), num_blocks=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("prompts", ["abc", b"ab", 5, [], ()],
                         ids=["engine-prompts-str", "engine-prompts-bytes", "engine-prompts-int",
                              "engine-prompts-empty-list", "engine-prompts-empty-tuple"])
def test_engine_refuses_prompts_that_are_not_a_non_empty_list_of_lists(
    llama: tuple[DecoderLM, ModelConfig], prompts: Any
) -> None:
    model, _ = llama
    engine = Engine(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="prompts must be a non-empty list of token-id lists"):
        engine.generate(prompts, GREEDY2)
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.parametrize(
    ("forced", "count"),
    [([[]], 0), ([[1, 2, 3]], 3)],
    ids=["engine-forced-empty", "engine-forced-longer-than-max-new"],
)
def test_engine_refuses_forced_tokens_outside_one_to_max_new(
    llama: tuple[DecoderLM, ModelConfig], forced: Any, count: int
) -> None:
    model, _ = llama
    engine = Engine(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match=rf"forced_tokens\[0\] must hold 1..max_new_tokens \(2\) tokens, got {count}"):
        engine.generate([[1, 2]], GREEDY2, forced_tokens=forced)
    assert engine.pool.num_free == engine.pool.num_blocks and engine.stats.generated_tokens == 0


def test_engine_takes_a_single_forced_token(llama: tuple[DecoderLM, ModelConfig]) -> None:
    """One forced token is the shortest forcing allowed (1..max_new_tokens): the request is that token."""
    model, _ = llama
    [result] = Engine(model, num_blocks=8, block_size=4).generate([[1, 2]], GREEDY2, forced_tokens=[[5]])
    assert result.token_ids == [5]


def test_engine_refuses_a_request_past_max_position_embeddings_and_runs_one_at_it(
    llama: tuple[DecoderLM, ModelConfig],
) -> None:
    model, config = llama
    assert config.max_position_embeddings == MAX_POSITIONS
    engine = Engine(model, num_blocks=MAX_POSITIONS // 16, block_size=16)
    over = [1] * (MAX_POSITIONS - 1)  # + 2 new tokens = 513 positions
    with pytest.raises(ValueError, match=rf"request 1: prompt \(511\) \+ max_new_tokens \(2\) exceeds .*\({MAX_POSITIONS}\)"):
        engine.generate([[1, 2], over], GREEDY2)
    assert engine.pool.num_free == engine.pool.num_blocks
    at_limit = [1] * (MAX_POSITIONS - 2)  # 510 + 2 = 512 positions: allowed
    [result] = engine.generate([at_limit], GREEDY2, forced_tokens=[[3, 4]])
    assert result.token_ids == [3, 4]


def test_engine_refuses_a_request_that_could_never_fit_the_pool_and_runs_one_that_just_fits(
    llama: tuple[DecoderLM, ModelConfig],
) -> None:
    model, _ = llama
    engine = Engine(model, num_blocks=2, block_size=4)  # 8 positions in all
    # The last token is never fed: prompt 5 + 5 new tokens hold 9 positions = 3 blocks of 4.
    with pytest.raises(ValueError, match=r"request 1 may need 3 blocks of 4 \(9 positions\) but the pool has 2"):
        engine.generate([[1, 2], [1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=5))
    assert engine.pool.num_free == 2
    # Prompt 5 + 4 new tokens hold 8 positions: exactly the pool.
    [result] = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=4),
                               forced_tokens=[[6, 7, 8, 9]])
    assert result.token_ids == [6, 7, 8, 9] and engine.stats.peak_blocks_used == 2
