"""The CUDA side of the bad-input suite: the captured decode step refuses NaN logits and bad ids.

GPU tier (``pytest -m gpu tests/robustness``): on CUDA the greedy fast path argmaxes on the device
inside a CUDA graph, so its checks differ from the eager path's; these prove they hold there too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from infer_ref.chat import render_chat_template
from infer_ref.engine import FastDecoder, SamplingParams, generate
from infer_ref.errors import NonFiniteError
from infer_ref.loader import load_model
from infer_ref.tokenizer import Tokenizer
from infer_ref.validation import TokenIdError

pytestmark = pytest.mark.gpu

LLAMA = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"


@pytest.mark.parametrize("decode", ["eager", "fast"], ids=["gpu-nan-eager", "gpu-nan-fast-cuda-graph"])
def test_nan_logits_stop_cuda_generation_naming_the_step(decode: str) -> None:
    """As the CPU test: an untied head and one generated token's embedding set to NaN."""
    model, _ = load_model(LLAMA, dtype=torch.float32, device="cuda")
    model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone())
    tok = Tokenizer(LLAMA)
    prompt = tok.encode(render_chat_template([{"role": "user", "content": "Count to ten."}], "llama"), add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    clean = generate(model, tok, prompt, params, device="cuda", decode=decode).token_ids  # type: ignore[arg-type]
    step = next(i for i, t in enumerate(clean) if t not in prompt and t not in clean[:i])
    with torch.no_grad():
        model.embed_tokens.weight[clean[step]] = math.nan
    bad = step + 1
    with pytest.raises(NonFiniteError, match=rf"step {bad} \(position {len(prompt) + bad - 1}\)"):
        generate(model, tok, prompt, params, device="cuda", decode=decode)  # type: ignore[arg-type]


def test_captured_decoder_refuses_out_of_vocab_input_and_still_works() -> None:
    model, config = load_model(LLAMA, dtype=torch.float32, device="cuda")
    decoder = FastDecoder(model, 32, device="cuda")  # captures a CUDA graph: the id check is skipped inside it
    assert decoder._graph is not None
    decoder.prefill(torch.tensor([[433, 5, 6]], device="cuda"))
    with pytest.raises(TokenIdError, match=str(config.vocab_size)):
        decoder.set_input([config.vocab_size])
    decoder.set_input([7])
    logits = decoder.step()  # the context is intact: no device-side assert happened
    assert torch.isfinite(logits).all()
