"""OpenVINO GenAI on the llama-tiny fixture, exported by optimum-intel: generated and prompt
logprobs against transformers' float64 oracle, chunked prefill against whole, the echo of a
prompt served from the prefix cache, and the KV budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.openvino import start_openvino
from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine, EngineWorkerError
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs

pytestmark = pytest.mark.openvino

MODEL_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"
# float32 weights, activations and K/V against the float64 oracle on a 2-layer model: measured
# below 1.1e-5 over the whole engine tier (docs/engines.md); 1e-4 is the kit's float32 margin.
ORACLE_TOLERANCE = 1e-4
# The same kernels over other slices of the prompt: only the summation order may change.
PATHS_TOLERANCE = 1e-5
PLAIN = EngineOptions(dtype="float32", prefix_caching=False, block_size=32, kv_cache_tokens=2048)
CHUNKED = EngineOptions(dtype="float32", prefix_caching=True, block_size=32, max_num_batched_tokens=16,
                        kv_cache_tokens=320)  # fmt: skip


def prompt(length: int, start: int) -> tuple[int, ...]:
    return (433, *((start + 7 * i) % 430 for i in range(length - 1)))  # BOS, then ids below the specials


REQUESTS = [EngineRequest(prompt=prompt(70, 3), max_tokens=8, prompt_logprobs=1, ignore_eos=True),
            EngineRequest(prompt=prompt(5, 40), max_tokens=6, ignore_eos=True)]  # fmt: skip


@pytest.fixture(scope="module")
def plain(openvino_interpreter: str) -> Iterator[BridgedEngine]:
    engine = start_openvino(MODEL_DIR, PLAIN, python=openvino_interpreter)
    yield engine
    engine.stop()


def oracle_gaps(request: EngineRequest, output: EngineOutput) -> list[float]:
    rows = oracle_logprobs(MODEL_DIR, (*request.prompt, *output.token_ids))  # row i predicts position i + 1
    pairs = [(len(request.prompt) - 1 + j, step) for j, step in enumerate(output.logprobs)]
    pairs += [(i - 1, step) for i, step in enumerate(output.prompt_logprobs or ()) if step is not None]
    return [abs(step.logprob - float(rows[row, step.token])) for row, step in pairs]


def test_logprobs_agree_with_the_oracle(plain: BridgedEngine) -> None:
    outputs = plain.generate(REQUESTS)
    assert [len(o.token_ids) for o in outputs] == [8, 6]
    assert outputs[0].prompt_logprobs is not None and len(outputs[0].prompt_logprobs) == 70
    assert max(g for r, o in zip(REQUESTS, outputs, strict=True) for g in oracle_gaps(r, o)) < ORACLE_TOLERANCE


def test_chunked_prefill_under_a_kv_budget_matches_whole(plain: BridgedEngine, openvino_interpreter: str) -> None:
    request = REQUESTS[0].__class__(prompt=REQUESTS[0].prompt, max_tokens=8, ignore_eos=True)
    [whole] = plain.generate([request])
    chunked_engine = start_openvino(MODEL_DIR, CHUNKED, python=openvino_interpreter)
    try:
        [chunked] = chunked_engine.generate([request])
    finally:
        chunked_engine.stop()
    assert chunked.token_ids == whole.token_ids
    assert max(abs(a.logprob - b.logprob) for a, b in zip(whole.logprobs, chunked.logprobs, strict=True)) <= PATHS_TOLERANCE


def test_prompt_logprobs_of_a_prefix_cache_hit_are_refused_not_misaligned(openvino_interpreter: str) -> None:
    # OpenVINO's echo gives logprobs for the prompt positions it computed only: the second request
    # (its first 64 tokens cached) would get 5 of its 69; the adapter fails it instead of guessing.
    engine = start_openvino(MODEL_DIR, CHUNKED, python=openvino_interpreter)
    try:
        engine.generate([EngineRequest(prompt=REQUESTS[0].prompt, max_tokens=2)])
        with pytest.raises(EngineWorkerError, match="prompt logprobs for a 70-token prompt"):
            engine.generate([REQUESTS[0]])
    finally:
        engine.stop()
