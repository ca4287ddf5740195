"""Token ids: integers in [0, vocab) checked before any work, by the model, generate and the tokenizer.

A refused forward leaves the KV cache exactly as it was (contents and position).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from infer_ref.cache import KVCache
from infer_ref.config import ModelConfig
from infer_ref.engine import SamplingParams, generate
from infer_ref.errors import UsageError
from infer_ref.models import DecoderLM
from infer_ref.tokenizer import Tokenizer
from infer_ref.validation import TokenIdError, check_token_ids

VOCAB = 439  # llama-tiny

# (id, input_ids tensor, error type, words)
FORWARD_CASES: list[tuple[str, Any, type[Exception], tuple[str, ...]]] = [
    ("negative", torch.tensor([[5, -1, 7]]), TokenIdError, ("-1", "[0, 1]", f"[0, {VOCAB})")),
    ("equal-to-vocab", torch.tensor([[VOCAB]]), TokenIdError, (str(VOCAB), "[0, 0]")),
    ("far-above-vocab", torch.tensor([[3, 10**9]]), TokenIdError, (str(10**9),)),
    ("int32-negative", torch.tensor([[-5]], dtype=torch.int32), TokenIdError, ("-5",)),
    ("float-dtype", torch.tensor([[1.0, 2.0]]), TypeError, ("torch.float32", "input_ids")),
    ("bool-dtype", torch.tensor([[True]]), TypeError, ("torch.bool",)),
    ("1-d", torch.tensor([1, 2]), ValueError, ("[batch, seq_len>=1]", "(2,)")),
    ("empty-sequence", torch.zeros((1, 0), dtype=torch.long), ValueError, ("(1, 0)",)),
    ("a-list", [[1, 2]], ValueError, ("list",)),
]


def _snapshot(cache: KVCache) -> tuple[int, torch.Tensor, torch.Tensor]:
    return cache.seq_len, cache.k.clone(), cache.v.clone()


@pytest.mark.parametrize(("ids", "error", "words"), [c[1:] for c in FORWARD_CASES], ids=[f"token-forward-{c[0]}" for c in FORWARD_CASES])
def test_forward_refuses_bad_ids_and_leaves_the_cache(
    llama: tuple[DecoderLM, ModelConfig], ids: Any, error: type[Exception], words: tuple[str, ...]
) -> None:
    model, config = llama
    cache = KVCache.from_model_config(config, 16, dtype=torch.float32, device="cpu")
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]), cache)  # some state to keep
    before = _snapshot(cache)
    with pytest.raises(error) as info, torch.inference_mode():
        model(ids, cache)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    after = _snapshot(cache)
    assert after[0] == before[0] and torch.equal(after[1], before[1]) and torch.equal(after[2], before[2])


# (id, prompt, words)
PROMPT_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("float", [1, 2.0, 3], ("prompt_token_ids[1]", "2.0", "float")),
    ("float-fractional", [1, 2.7], ("prompt_token_ids[1]", "2.7")),
    ("bool", [True, 2], ("prompt_token_ids[0]", "True")),
    ("string-id", [1, "2"], ("prompt_token_ids[1]", "'2'")),
    ("a-string", "hello", ("prompt_token_ids", "str")),
    ("negative", [4, -3], ("prompt_token_ids[1]", "-3", f"[0, {VOCAB})")),
    ("out-of-vocab", [4, VOCAB + 1], ("prompt_token_ids[1]", str(VOCAB + 1))),
    ("numpy-float", [np.float64(3.0)], ("prompt_token_ids[0]", "3.0")),
    ("none-id", [None], ("prompt_token_ids[0]", "None")),
    ("tensor-2d", torch.tensor([[1, 2]]), ("prompt_token_ids", "1-D", "(1, 2)")),
    ("tensor-float", torch.tensor([1.0, 2.0]), ("prompt_token_ids", "torch.float32")),
    ("tensor-out-of-vocab", torch.tensor([1, VOCAB]), ("prompt_token_ids", str(VOCAB))),
    ("empty", [], ("prompt_token_ids is empty",)),
]


@pytest.mark.parametrize(("prompt", "words"), [c[1:] for c in PROMPT_CASES], ids=[f"token-generate-{c[0]}" for c in PROMPT_CASES])
def test_generate_refuses_bad_prompt_ids_before_any_work(
    llama: tuple[DecoderLM, ModelConfig], llama_tokenizer: Tokenizer, prompt: Any, words: tuple[str, ...]
) -> None:
    model, _ = llama
    calls: list[int] = []
    with pytest.raises(UsageError) as info:
        generate(model, llama_tokenizer, prompt, SamplingParams(temperature=0.0, max_new_tokens=2), device="cpu",
                 on_token=calls.append)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert calls == []  # nothing was generated


def test_numpy_integers_are_ids() -> None:
    """Integer types other than int are integers: accepted, not refused (and never truncated floats)."""
    check_token_ids([np.int64(3), np.int32(4)], 5)


@pytest.mark.parametrize(
    ("ids", "words"),
    [([VOCAB], ("ids[0]", str(VOCAB))), ([-1], ("ids[0]", "-1")), ([1.5], ("ids[0]", "1.5"))],
    ids=["token-decode-out-of-vocab", "token-decode-negative", "token-decode-float"],
)
def test_decode_refuses_bad_ids(llama_tokenizer: Tokenizer, ids: list[Any], words: tuple[str, ...]) -> None:
    with pytest.raises(TokenIdError) as info:
        llama_tokenizer.decode(ids)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("idx", "words"),
    [(-1, ("idx is -1", "expected a token id >= 0")), (-(2**70), ("idx is -1180591620717411303424", ">= 0")),
     (1.5, ("idx is 1.5", "float")), (True, ("idx is True", "bool"))],
    ids=["token-id-to-token-negative", "token-id-to-token-huge-negative", "token-id-to-token-float", "token-id-to-token-bool"],
)
def test_id_to_token_refuses_ids_that_are_never_ids(llama_tokenizer: Tokenizer, idx: Any, words: tuple[str, ...]) -> None:
    """A negative Python int used to reach the tokenizer library as ``OverflowError: number too small``."""
    with pytest.raises(TokenIdError) as info:
        llama_tokenizer.id_to_token(idx)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("idx", [VOCAB, 2**40, 2**70], ids=["vocab", "2-pow-40", "2-pow-70"])
def test_id_to_token_past_the_vocabulary_is_none_as_documented(llama_tokenizer: Tokenizer, idx: int) -> None:
    assert llama_tokenizer.id_to_token(idx) is None
    assert llama_tokenizer.id_to_token(VOCAB - 1) is not None  # the last id is a token


@pytest.mark.parametrize("ids", [-1, 5, None], ids=["token-decode-negative-int", "token-decode-int", "token-decode-none"])
def test_decode_refuses_a_single_id_instead_of_a_sequence(llama_tokenizer: Tokenizer, ids: Any) -> None:
    with pytest.raises(TokenIdError, match=rf"ids must be a sequence of integer token ids, got {ids!r} \({type(ids).__name__}\)"):
        llama_tokenizer.decode(ids)


@pytest.mark.parametrize(
    ("ids", "error", "words"),
    [
        ([VOCAB], TokenIdError, ("token_ids[0]", str(VOCAB))),
        ([-2], TokenIdError, ("token_ids[0]", "-2")),
        ([2.7], TokenIdError, ("token_ids[0]", "2.7")),
        (torch.tensor([2.7]), TokenIdError, ("token_ids", "torch.float32")),
        (torch.tensor([VOCAB + 3]), TokenIdError, ("token_ids", str(VOCAB + 3))),
        ([1, 2], UsageError, ("2 ids", "batch is 1")),
    ],
    ids=["token-fast-input-out-of-vocab", "token-fast-input-negative", "token-fast-input-float",
         "token-fast-input-float-tensor", "token-fast-input-tensor-out-of-vocab", "token-fast-input-wrong-batch"],
)
def test_fast_decoder_input_is_checked_and_the_buffer_kept(
    llama: tuple[DecoderLM, ModelConfig], ids: Any, error: type[Exception], words: tuple[str, ...]
) -> None:
    """The captured step cannot check ids (on CUDA an out-of-range id is a device-side assert): set_input does."""
    from infer_ref.engine import FastDecoder

    model, _ = llama
    decoder = FastDecoder(model, 16, device="cpu")
    decoder.set_input([5])
    with pytest.raises(error) as info:
        decoder.set_input(ids)
    for word in words:
        assert word in str(info.value)
    assert decoder.input_ids.tolist() == [[5]]


def test_check_ids_false_skips_only_the_range_check(llama: tuple[DecoderLM, ModelConfig]) -> None:
    """``check_ids=False`` is for ids made on the device from the model's own logits: the same
    logits as a checked call for valid ids; the dtype/shape checks still apply; a non-bool flag is
    refused with the cache unchanged."""
    model, config = llama
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        checked = model(ids)
        unchecked = model(ids, check_ids=False)
    assert torch.equal(checked, unchecked)
    with pytest.raises(TypeError, match="torch.float32"), torch.inference_mode():
        model(torch.tensor([[1.0]]), check_ids=False)
    cache = KVCache.from_model_config(config, 16, dtype=torch.float32, device="cpu")
    with pytest.raises(TypeError, match="check_ids must be a bool, got 'no'"), torch.inference_mode():
        model(ids, cache, check_ids="no")  # type: ignore[arg-type]
    assert cache.seq_len == 0 and not cache.k.any()


@pytest.mark.parametrize(
    ("prompts", "forced", "words"),
    [
        ([[1.5, 2]], None, ("prompts[0][0]", "1.5", "float")),
        ([[3, True]], None, ("prompts[0][1]", "True")),
        ([[4, -2]], None, ("prompts[0][1]", "-2")),
        ([[1, 2]], [[-1]], ("forced_tokens[0][0]", "-1", f"[0, {VOCAB})")),
        ([[1, 2]], [[2.7]], ("forced_tokens[0][0]", "2.7")),
        ([[1, 2]], [[VOCAB]], ("forced_tokens[0][0]", str(VOCAB))),
    ],
    ids=["token-engine-prompt-float", "token-engine-prompt-bool", "token-engine-prompt-negative",
         "token-engine-forced-negative", "token-engine-forced-float", "token-engine-forced-out-of-vocab"],
)
def test_engine_refuses_bad_ids_before_anything_runs(
    llama: tuple[DecoderLM, ModelConfig], prompts: Any, forced: Any, words: tuple[str, ...]
) -> None:
    """Ids were converted with int() (2.7 ran as 2) and forced tokens were never range-checked."""
    from infer_ref.engine.engine import Engine

    model, _ = llama
    engine = Engine(model, num_blocks=8, block_size=4)
    with pytest.raises(TokenIdError) as info:
        engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=2), forced_tokens=forced)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert engine.pool.num_free == engine.pool.num_blocks and engine.stats.generated_tokens == 0
