"""Sampling and generation: SamplingParams fields, logits that cannot decide a token, a tokenizer of
another model. Never a silent token 0, never ``finish_reason="length"`` over NaN logits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from infer_ref.chat import render_chat_template
from infer_ref.config import ModelConfig
from infer_ref.engine import SamplingParams, generate, sample_token
from infer_ref.errors import NonFiniteError, UsageError
from infer_ref.loader import load_model
from infer_ref.models import DecoderLM
from infer_ref.sampling import MAX_SEED
from infer_ref.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
LLAMA = FIXTURES / "llama-tiny"

# (id, field values, words the message must contain)
PARAM_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("temperature-negative", {"temperature": -0.5}, ("temperature", "-0.5")),
    ("temperature-nan", {"temperature": math.nan}, ("temperature", "nan")),
    ("temperature-inf", {"temperature": math.inf}, ("temperature", "inf")),
    ("temperature-string", {"temperature": "0.7"}, ("temperature", "'0.7'")),
    ("temperature-none", {"temperature": None}, ("temperature", "None")),
    ("temperature-bool", {"temperature": True}, ("temperature", "True")),
    ("top-k-zero", {"top_k": 0}, ("top_k", "0")),
    ("top-k-negative", {"top_k": -3}, ("top_k", "-3")),
    ("top-k-float", {"top_k": 5.0}, ("top_k", "5.0")),
    ("top-k-bool", {"top_k": True}, ("top_k", "True")),
    ("top-p-zero", {"top_p": 0.0}, ("top_p", "0.0")),
    ("top-p-above-one", {"top_p": 1.01}, ("top_p", "1.01")),
    ("top-p-nan", {"top_p": math.nan}, ("top_p", "nan")),
    ("top-p-string", {"top_p": "0.9"}, ("top_p", "'0.9'")),
    ("repetition-zero", {"repetition_penalty": 0.0}, ("repetition_penalty", "0.0")),
    ("repetition-negative", {"repetition_penalty": -1.2}, ("repetition_penalty", "-1.2")),
    ("repetition-inf", {"repetition_penalty": math.inf}, ("repetition_penalty", "inf")),
    ("repetition-nan", {"repetition_penalty": math.nan}, ("repetition_penalty", "nan")),
    ("seed-2-pow-64", {"seed": 2**64}, ("seed", str(2**64), "2**64 - 1")),
    ("seed-negative", {"seed": -1}, ("seed", "-1")),
    ("seed-float", {"seed": 1.5}, ("seed", "1.5")),
    ("seed-string", {"seed": "42"}, ("seed", "'42'")),
    ("max-new-tokens-zero", {"max_new_tokens": 0}, ("max_new_tokens", "0")),
    ("max-new-tokens-float", {"max_new_tokens": 8.0}, ("max_new_tokens", "8.0")),
    ("max-new-tokens-bool", {"max_new_tokens": True}, ("max_new_tokens", "True")),
    ("stop-empty-string", {"stop": ("",)}, ("stop", "''")),
    ("stop-not-strings", {"stop": [1, 2]}, ("stop", "(1, 2)")),
    ("stop-an-int", {"stop": 5}, ("stop", "5")),
    ("stop-none-in-list", {"stop": ["a", None]}, ("stop", "None")),
]


@pytest.mark.parametrize(("fields", "words"), [c[1:] for c in PARAM_CASES], ids=[f"sampling-{c[0]}" for c in PARAM_CASES])
def test_bad_sampling_params_are_refused_naming_the_field(fields: dict[str, Any], words: tuple[str, ...]) -> None:
    with pytest.raises(UsageError) as info:
        SamplingParams(**fields)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_largest_seed_is_accepted() -> None:
    SamplingParams(seed=MAX_SEED).make_generator()


# (id, logits [V], words)
LOGIT_CASES: list[tuple[str, list[float], tuple[str, ...]]] = [
    ("all-nan", [math.nan] * 4, ("4 NaN",)),
    ("one-nan", [1.0, math.nan, 0.0, 2.0], ("1 NaN",)),
    ("all-neg-inf", [-math.inf] * 4, ("all 4 values are -inf",)),
    ("pos-inf", [0.0, math.inf, 1.0, 0.0], ("1 +inf",)),
]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize(("logits", "words"), [c[1:] for c in LOGIT_CASES], ids=[f"sampling-logits-{c[0]}" for c in LOGIT_CASES])
def test_logits_that_cannot_decide_raise_instead_of_token_0(logits: list[float], words: tuple[str, ...], temperature: float) -> None:
    params = SamplingParams(temperature=temperature, seed=0)
    with pytest.raises(NonFiniteError) as info:
        sample_token(torch.tensor(logits), [], params, params.make_generator(), where="step 4 (position 11)")
    for word in (*words, "step 4 (position 11)"):
        assert word in str(info.value)


def test_logits_that_cannot_decide_name_the_sampled_position_by_default() -> None:
    with pytest.raises(NonFiniteError, match=r"the sampled position\b"):
        sample_token(torch.tensor([math.nan] * 4), [], SamplingParams(temperature=0.0))


@pytest.mark.parametrize(
    "temperature", [1e-40, 1e-300, 5e-324], ids=["sampling-accepted-tiny-temperature-1e-40", "sampling-accepted-tiny-temperature-1e-300", "sampling-accepted-tiny-temperature-5e-324"]
)
def test_tiny_temperature_picks_the_best_token(temperature: float) -> None:
    """softmax(l / T) tends to the one-hot of the argmax as T -> 0; 3 - 1 = 2 apart, nothing else is possible."""
    params = SamplingParams(temperature=temperature, seed=0)
    logits = torch.tensor([1.0, 3.0, -2.0, 2.999])
    assert [sample_token(logits, [], params, params.make_generator()) for _ in range(3)] == [1, 1, 1]


def test_masked_logits_are_fine() -> None:
    """-inf on some tokens (a mask) is a valid distribution: not refused."""
    params = SamplingParams(temperature=0.0)
    assert sample_token(torch.tensor([-math.inf, 0.5, -math.inf]), [], params) == 1


# -- generation over a poisoned model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def poisoned() -> tuple[DecoderLM, ModelConfig, list[int], int]:
    """llama-tiny with an untied head and the embedding of one generated token set to NaN.

    The token's logit stays finite (the head is a separate copy), so the first steps are fine; once
    the token is fed back its NaN embedding makes every later logit NaN.
    """
    model, config = load_model(LLAMA, dtype=torch.float32, device="cpu")
    model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone())
    tok = Tokenizer(LLAMA)
    chat = render_chat_template([{"role": "user", "content": "Count to ten."}], "llama")
    prompt = tok.encode(chat, add_special_tokens=False)
    clean = generate(model, tok, prompt, SamplingParams(temperature=0.0, max_new_tokens=6), device="cpu").token_ids
    step = next(i for i, t in enumerate(clean) if t not in prompt and t not in clean[:i])
    with torch.no_grad():
        model.embed_tokens.weight[clean[step]] = math.nan
    return model, config, prompt, step


@pytest.mark.parametrize(
    "how", [{"use_kv_cache": True}, {"use_kv_cache": False}, {"decode": "fast"}],
    ids=["generate-nan-eager", "generate-nan-uncached", "generate-nan-fast"],
)
def test_nan_logits_stop_generation_naming_the_step(poisoned: tuple[Any, ...], llama_tokenizer: Tokenizer, how: dict[str, Any]) -> None:
    model, _, prompt, step = poisoned
    bad = step + 1  # the step that first feeds the poisoned token
    tokens: list[int] = []
    with pytest.raises(NonFiniteError) as info:
        generate(model, llama_tokenizer, prompt, SamplingParams(temperature=0.0, max_new_tokens=12), device="cpu",
                 on_token=tokens.append, **how)
    assert f"step {bad} (position {len(prompt) + bad - 1})" in str(info.value)
    if "decode" not in how:  # the eager loops stop at once; the fast one reads tokens back in chunks
        assert len(tokens) == bad


def test_nan_weight_everywhere_fails_at_step_0(llama_tokenizer: Tokenizer) -> None:
    model, _ = load_model(LLAMA, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        model.norm.weight[0] = math.nan
    with pytest.raises(NonFiniteError, match=r"step 0 \(position 3\).*439 NaN"):
        generate(model, llama_tokenizer, [1, 2, 3, 4], SamplingParams(temperature=0.0, max_new_tokens=4), device="cpu")


@pytest.mark.parametrize("family", ["qwen3-tiny", "gemma3-tiny"], ids=["generate-tokenizer-qwen3", "generate-tokenizer-gemma3"])
def test_tokenizer_of_another_family_is_refused(llama: tuple[DecoderLM, ModelConfig], family: str) -> None:
    model, _ = llama
    other = Tokenizer(FIXTURES / family)
    with pytest.raises(UsageError) as info:
        generate(model, other, [1, 2], SamplingParams(temperature=0.0, max_new_tokens=2), device="cpu")
    assert other.model_type in str(info.value) and "llama" in str(info.value)


def test_params_of_the_wrong_type_are_refused(llama: tuple[DecoderLM, ModelConfig], llama_tokenizer: Tokenizer) -> None:
    model, _ = llama
    with pytest.raises(UsageError, match="params must be a SamplingParams, got dict"):
        generate(model, llama_tokenizer, [1, 2], {"temperature": 0.0}, device="cpu")  # type: ignore[arg-type]


def test_too_long_request_is_refused(llama: tuple[DecoderLM, ModelConfig], llama_tokenizer: Tokenizer) -> None:
    model, config = llama
    with pytest.raises(UsageError, match=f"exceeds the model's max_position_embeddings \\({config.max_position_embeddings}\\)"):
        generate(model, llama_tokenizer, [1] * 10, SamplingParams(max_new_tokens=config.max_position_embeddings), device="cpu")


def test_generate_without_a_device_runs_where_the_model_can(
    llama: tuple[DecoderLM, ModelConfig], llama_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``device`` used to default to "cuda": a traceback on every CPU machine. Now CUDA when available, else CPU."""
    from infer_ref.devices import AUTO_DEVICE_ENV, default_device

    model, _ = llama
    monkeypatch.delenv(AUTO_DEVICE_ENV, raising=False)  # the automatic choice itself is checked here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == torch.device("cpu")
    result = generate(model, llama_tokenizer, [433, 5], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert result.generated_tokens >= 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == torch.device("cuda")
