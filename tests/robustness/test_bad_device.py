"""Devices named through the API: a name torch does not know, or CUDA on a machine without it.

Refused as a :class:`UsageError` naming the device (torch's own errors are a ``RuntimeError``
listing every device type it was built with, or an ``AssertionError`` at the first allocation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from infer_ref.cache import KVCache
from infer_ref.config import ModelConfig
from infer_ref.engine import SamplingParams, generate
from infer_ref.errors import UsageError
from infer_ref.models import DecoderLM
from infer_ref.tokenizer import Tokenizer

CUDA_MISSING = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def _generate(device: str) -> Callable[[Any, Any], object]:
    return lambda model, tok: generate(model, tok, [1, 2], SamplingParams(temperature=0.0, max_new_tokens=2), device=device)


def _allocate(device: str) -> Callable[[Any, Any], object]:
    return lambda model, tok: KVCache.allocate(2, 2, 4, 8, device=device)


CASES = [
    pytest.param(_generate("warp9"), "unknown device 'warp9'", id="device-generate-unknown"),
    pytest.param(_allocate("warp9"), "unknown device 'warp9'", id="device-cache-unknown"),
    pytest.param(_generate("cuda"), "'cuda' requested but CUDA is not available", id="device-generate-cuda-missing",
                 marks=CUDA_MISSING),
    pytest.param(_allocate("cuda:0"), "'cuda:0' requested but CUDA is not available", id="device-cache-cuda-missing",
                 marks=CUDA_MISSING),
]


@pytest.mark.parametrize(("call", "words"), CASES)
def test_a_device_this_machine_cannot_use_is_named(
    llama: tuple[DecoderLM, ModelConfig], llama_tokenizer: Tokenizer, call: Callable[[Any, Any], object], words: str
) -> None:
    model, _ = llama
    with pytest.raises(UsageError, match=words):
        call(model, llama_tokenizer)
