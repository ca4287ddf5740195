"""The engine on CUDA in bf16 (Llama-3.2-1B shape, random weights): teacher-forced and tie-aware.

* cold vs warm: 8 requests share a 1024-token system prompt; with prefix caching on, each is fed
  the tokens it chose with caching off, and every step is within the golden files' bf16
  tolerance (the forced token within ``eps`` of the best logprob, top-k logprobs within
  ``topk_atol``). Fails if no hit happened.
* batch row vs alone: every row of the batch, fed the tokens the request chose alone, likewise.

Run on a GPU machine: ``PYTHONPATH=. pytest -m gpu tests/integration/test_engine_gpu.py -v``
(``scripts/gpu_engine.sh`` runs it together with the benchmark).
"""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.bench_engine import checks, make_prompts
from benchmarks.bench_utils import load_bench_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    m, _, _ = load_bench_model("llama-3.2-1b", torch.device("cuda"), torch.bfloat16)
    return m


def test_cold_equals_warm_and_batch_rows_equal_alone_bf16(model) -> None:
    args = argparse.Namespace(new_tokens=24, block_size=16, max_batch=8)
    prompts = make_prompts(model.config.vocab_size, requests=8, system_tokens=1024, user_tokens=48, seed=3)
    result = checks(model, prompts, args, "bfloat16")
    assert sum(result["warm_cached_tokens"]) >= 7 * 1024, result["warm_cached_tokens"]
    for name in ("cold_vs_warm", "batch_vs_alone"):
        assert result[name]["ok"], f"{name}: " + "; ".join(result[name]["per_request"])
