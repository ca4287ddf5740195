"""Seed 000's tests on the real dev models, when local snapshots are available.

Nothing is downloaded. Point ``INFER_REF_MODELS`` at a folder holding snapshots of
``meta-llama/Llama-3.2-1B-Instruct``, ``Qwen/Qwen3-1.7B`` and ``google/gemma-3-1b-it`` (either as
``$INFER_REF_MODELS/<org>/<name>`` or ``$INFER_REF_MODELS/<name>``); each model whose snapshot is
missing is skipped with a message saying so.
"""

from __future__ import annotations

import os

import pytest
import torch

from infer_ref import SamplingParams, Tokenizer, generate, load_model, render_chat_template
from infer_ref.paths import resolve_model_path

DEV_MODELS = ("meta-llama/Llama-3.2-1B-Instruct", "Qwen/Qwen3-1.7B", "google/gemma-3-1b-it")
HOW_TO = (
    "set INFER_REF_MODELS to a folder holding a local snapshot of {name} "
    "(config.json, *.safetensors, tokenizer.json); nothing is downloaded"
)


@pytest.fixture(scope="module", params=DEV_MODELS)
def real_model(request, device):
    if not os.environ.get("INFER_REF_MODELS"):
        pytest.skip(HOW_TO.format(name=request.param))
    try:
        folder = resolve_model_path(request.param)
    except FileNotFoundError:
        pytest.skip(HOW_TO.format(name=request.param))
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model, config = load_model(folder, dtype=dtype, device=device)
    return folder, model, config, Tokenizer(folder)


def _prompt(config, tokenizer: Tokenizer, text: str) -> list[int]:
    options = {"enable_thinking": False} if config.model_type == "qwen3" else {}
    rendered = render_chat_template([{"role": "user", "content": text}], config.model_type, **options)
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_kv_cache_output_equivalence(real_model, device) -> None:
    _, model, config, tokenizer = real_model
    prompt = _prompt(config, tokenizer, "Count to ten.")
    params = SamplingParams(temperature=0.0, max_new_tokens=64)
    uncached = generate(model, tokenizer, prompt, params, device=device, use_kv_cache=False)
    cached = generate(model, tokenizer, prompt, params, device=device, use_kv_cache=True)
    assert cached.token_ids == uncached.token_ids
    assert cached.text == uncached.text
    assert cached.finish_reason == uncached.finish_reason


def test_kv_cache_seeded_equivalence(real_model, device) -> None:
    _, model, config, tokenizer = real_model
    prompt = _prompt(config, tokenizer, "Write a short poem.")
    params = SamplingParams(temperature=0.7, seed=42, max_new_tokens=32)
    uncached = generate(model, tokenizer, prompt, params, device=device, use_kv_cache=False)
    cached = generate(model, tokenizer, prompt, params, device=device, use_kv_cache=True)
    assert cached.token_ids == uncached.token_ids


@torch.no_grad()
def test_logits_match_transformers(real_model, device) -> None:
    transformers = pytest.importorskip("transformers")
    folder, model, config, tokenizer = real_model
    dtype = next(model.parameters()).dtype
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids = torch.tensor([_prompt(config, tokenizer, "What is the capital of France?")], device=device)
    ours_logits, their_logits = model(ids).float(), theirs(ids).logits.float()
    # Same argmax everywhere; values within what the dtype's rounding allows.
    assert torch.equal(ours_logits.argmax(-1), their_logits.argmax(-1))
    tolerance = 1e-3 if dtype == torch.float32 else 0.25
    assert (ours_logits - their_logits).abs().max().item() <= tolerance
