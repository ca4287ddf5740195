"""ONNX Runtime GenAI on the llama-tiny fixture, built by its own model builder: every logprob against
transformers' float64 oracle, a prompt appended in slices against whole, what it declares, and its
builder's own refusals as "not supported" in the builder's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.ortgenai import start_ortgenai
from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

pytestmark = pytest.mark.ortgenai

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
MODEL_DIR = FIXTURES / "llama-tiny"
OPTIONS = EngineOptions(dtype="float32", prefix_caching=False, max_model_len=256)
# float32 weights, activations and K/V against the float64 oracle on a 2-layer model: measured below
# 1e-5 (docs/engines.md); 1e-4 is the kit's float32 margin.
ORACLE_TOLERANCE = 1e-4
# The same graph over other slices of the prompt: only the summation order of a row may change.
PATHS_TOLERANCE = 1e-5


def prompt(length: int, start: int) -> tuple[int, ...]:
    return (433, *((start + 7 * i) % 430 for i in range(length - 1)))  # BOS, then ids below the specials


REQUESTS = [
    EngineRequest(prompt=prompt(41, 3), max_tokens=12, logprobs=5, prompt_logprobs=5),
    EngineRequest(prompt=prompt(5, 40), max_tokens=8, logprobs=3),
    EngineRequest(prompt=prompt(9, 2), max_tokens=10, temperature=1.0, seed=7, top_k=20, top_p=0.9, logprobs=2),
]


@pytest.fixture(scope="module")
def engine(ortgenai_interpreter: str) -> Iterator[BridgedEngine]:
    handle = start_ortgenai(MODEL_DIR, OPTIONS, python=ortgenai_interpreter)
    yield handle
    handle.stop()


def test_it_declares_what_its_worker_reports(engine: BridgedEngine) -> None:
    assert engine.capabilities == start_ortgenai.capabilities  # type: ignore[attr-defined]
    assert "prefix_caching" not in engine.capabilities and "batch" not in engine.capabilities
    assert engine.versions["onnxruntime_genai"] in engine.name


def test_every_logprob_agrees_with_the_float64_oracle(engine: BridgedEngine) -> None:
    for request, out in zip(REQUESTS, engine.generate(REQUESTS), strict=True):
        tokens = (*request.prompt, *out.token_ids)
        oracle = oracle_logprobs(MODEL_DIR, tokens)  # [len(tokens), vocab], float64
        for step, position in enumerate(out.logprobs):
            row = oracle[len(request.prompt) - 1 + step]
            assert position.token == out.token_ids[step]
            for token, logprob in position.top:
                assert abs(logprob - float(row[token])) < ORACLE_TOLERANCE, (request, step, token)
        for i, position in enumerate(out.prompt_logprobs or ()):
            if position is not None:
                assert position.token == request.prompt[i]
                assert abs(position.logprob - float(oracle[i - 1][position.token])) < ORACLE_TOLERANCE, (request, i)


def test_a_prompt_appended_in_slices_answers_as_whole(engine: BridgedEngine, ortgenai_interpreter: str) -> None:
    chunked = start_ortgenai(MODEL_DIR, EngineOptions(dtype="float32", prefix_caching=False, max_num_batched_tokens=16),
                             python=ortgenai_interpreter)  # fmt: skip
    try:
        sliced, whole = chunked.generate(REQUESTS[:1])[0], engine.generate(REQUESTS[:1])[0]
    finally:
        chunked.stop()
    assert sliced.token_ids == whole.token_ids
    pairs = [*zip(sliced.logprobs, whole.logprobs, strict=True), *zip(sliced.prompt_logprobs[1:], whole.prompt_logprobs[1:], strict=True)]  # type: ignore[index]
    assert max(abs(a.logprob - b.logprob) for a, b in pairs if a and b) < PATHS_TOLERANCE


def test_a_seeded_sampled_request_repeats(engine: BridgedEngine) -> None:
    first, again = engine.generate(REQUESTS[2:]), engine.generate(REQUESTS[2:])
    assert first[0].token_ids == again[0].token_ids


def test_a_prefix_cache_asked_for_is_refused(ortgenai_interpreter: str) -> None:
    with pytest.raises(Unsupported, match="no prefix cache shared between requests"):
        start_ortgenai(MODEL_DIR, EngineOptions(dtype="float32", prefix_caching=True), python=ortgenai_interpreter)


def test_a_kv_budget_below_the_longest_request_is_refused(ortgenai_interpreter: str) -> None:
    small = EngineOptions(dtype="float32", prefix_caching=False, kv_cache_tokens=64, max_model_len=256)
    with pytest.raises(Unsupported, match="a KV budget of 64 tokens below max_model_len 256"):
        start_ortgenai(MODEL_DIR, small, python=ortgenai_interpreter)


def test_an_architecture_the_builder_refuses_is_not_supported_in_its_words(ortgenai_interpreter: str, tmp_path: Path) -> None:
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 1,
        "n_positions": 64, "vocab_size": 50,
    }))  # fmt: skip
    with pytest.raises(Unsupported, match="model is not currently supported") as info:
        start_ortgenai(folder, OPTIONS, python=ortgenai_interpreter, cache=tmp_path / "cache")
    assert "\n" not in str(info.value)


def test_gemma3_stops_the_builder_at_its_rope_parameters(ortgenai_interpreter: str, tmp_path: Path) -> None:
    # docs/engines.md: the builder reads config.rope_parameters["rope_type"], which transformers 5
    # nests per layer type for Gemma 3. A failure, not a refusal: Gemma3ForCausalLM is on its list.
    with pytest.raises(DataError, match="KeyError: 'rope_type'") as info:
        start_ortgenai(FIXTURES / "gemma3-tiny", OPTIONS, python=ortgenai_interpreter, cache=tmp_path)
    assert not isinstance(info.value, Unsupported)
