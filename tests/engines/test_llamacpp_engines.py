"""llama.cpp (llama-cpp-python) on the llama-tiny fixture, converted by llama.cpp's own converter:
every logprob against transformers' float64 oracle, chunked evaluation against whole, the prefix
reuse switched off and on, EOS and stop strings, and the server's own limits."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.llamacpp import start_llamacpp
from infer_ref.conformance.engines.adapters.llamacpp_server import start_llamacpp_server
from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs
from infer_ref.conformance.interface.contract import Unsupported

pytestmark = pytest.mark.llamacpp

MODEL_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"
OPTIONS = EngineOptions(dtype="float32", prefix_caching=False, max_model_len=256)
# float32 weights, activations and K/V against the float64 oracle on a 2-layer model: the measured
# differences are below 1e-5 (docs/engines.md); 1e-4 is the kit's float32 margin.
ORACLE_TOLERANCE = 1e-4
# The same kernels over other slices of the prompt: only the summation order of a row may change.
PATHS_TOLERANCE = 1e-5
EOS = 438  # <|eot_id|>, the GGUF's eos_token_id (tokenizer_config.json's eos_token)


def prompt(length: int, start: int) -> tuple[int, ...]:
    return (433, *((start + 7 * i) % 430 for i in range(length - 1)))  # BOS, then ids below the specials


REQUESTS = [
    EngineRequest(prompt=prompt(41, 3), max_tokens=12, logprobs=5, prompt_logprobs=5),
    EngineRequest(prompt=prompt(5, 40), max_tokens=8, logprobs=3),
    EngineRequest(prompt=prompt(32, 11), max_tokens=34, logprobs=2, prompt_logprobs=1, ignore_eos=True),
    EngineRequest(prompt=prompt(9, 2), max_tokens=10, temperature=1.0, seed=7, top_k=20, top_p=0.9, logprobs=2),
]
SAMPLED = 3


def oracle_gaps(request: EngineRequest, output: EngineOutput) -> list[float]:
    """|engine - oracle| for every logprob the engine returned, teacher-forced on its own tokens."""
    rows = oracle_logprobs(MODEL_DIR, (*request.prompt, *output.token_ids))
    positions = [(len(request.prompt) - 1 + j, step) for j, step in enumerate(output.logprobs)]
    positions += [(i - 1, step) for i, step in enumerate(output.prompt_logprobs or ()) if step is not None]
    return [abs(lp - float(rows[row, token])) for row, step in positions for token, lp in ((step.token, step.logprob), *step.top)]


@pytest.fixture(scope="module")
def whole(llamacpp_interpreter: str) -> Iterator[BridgedEngine]:
    engine = start_llamacpp(MODEL_DIR, OPTIONS, python=llamacpp_interpreter)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def answers(whole: BridgedEngine) -> list[EngineOutput]:
    return whole.generate(REQUESTS)


def test_logprobs_match_the_float64_oracle(answers: list[EngineOutput]) -> None:
    for request, output in zip(REQUESTS, answers, strict=True):
        assert len(output.logprobs) == len(output.token_ids) >= 1
        if request.prompt_logprobs is not None:
            assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(request.prompt)
            assert output.prompt_logprobs[0] is None
        gaps = oracle_gaps(request, output)
        assert max(gaps) <= ORACLE_TOLERANCE, f"max |llama.cpp - oracle| = {max(gaps):.2e} for {request}"
    assert len(answers[2].token_ids) == 34 and answers[2].finish_reason == "length"


def test_a_seed_repeats_and_eos_ends_a_request(whole: BridgedEngine, answers: list[EngineOutput]) -> None:
    again = whole.generate([REQUESTS[SAMPLED], REQUESTS[SAMPLED]])
    assert again[0].token_ids == again[1].token_ids == answers[SAMPLED].token_ids
    # The fixture answers its canonical prompts up to <|eot_id|>: the EOS comes last, finish "stop".
    [done] = whole.generate([EngineRequest(prompt=(433, 5, 6, 7, 8), max_tokens=32, logprobs=1)])
    assert done.token_ids[-1] == EOS and done.finish_reason == "stop" and EOS not in done.token_ids[:-1]


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_evaluation_matches_whole(llamacpp_interpreter: str, answers: list[EngineOutput], chunk: int) -> None:
    # Llama.eval in slices of n_batch = n_ubatch = chunk tokens: 1 is every prompt token decoded
    # alone, 7 divides none of the prompts (41, 5, 32 tokens), 16 divides one.
    chunked = start_llamacpp(MODEL_DIR, EngineOptions(dtype="float32", prefix_caching=False, max_model_len=256,
                                                      max_num_batched_tokens=chunk), python=llamacpp_interpreter)  # fmt: skip
    try:
        outputs = chunked.generate(REQUESTS[:3])
    finally:
        chunked.stop()
    for mine, theirs in zip(answers, outputs, strict=False):
        assert mine.token_ids == theirs.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(mine.logprobs, theirs.logprobs, strict=True)) <= PATHS_TOLERANCE


def test_the_previous_prefix_is_reused_only_with_prefix_caching(llamacpp_interpreter: str) -> None:
    # The second request shares 40 tokens with the first: with prefix caching Llama.generate keeps them.
    first = EngineRequest(prompt=prompt(41, 3), max_tokens=4, logprobs=1, prompt_logprobs=1)
    second = EngineRequest(prompt=(*prompt(41, 3)[:40], 17, 18), max_tokens=4, logprobs=1, prompt_logprobs=1)
    engine = start_llamacpp(MODEL_DIR, EngineOptions(dtype="float32", max_model_len=256), python=llamacpp_interpreter)
    try:
        _, warm = engine.generate([first, second])
    finally:
        engine.stop()
    assert max(oracle_gaps(second, warm)) <= ORACLE_TOLERANCE


def test_the_server_refuses_a_start_without_prefix_reuse(llamacpp_interpreter: str) -> None:
    with pytest.raises(Unsupported, match="llama_cpp.server always reuses the previous request's prefix"):
        start_llamacpp_server(MODEL_DIR, OPTIONS, python=llamacpp_interpreter)


def test_a_kv_budget_below_the_context_is_unsupported(llamacpp_interpreter: str) -> None:
    with pytest.raises(Unsupported, match="llama.cpp holds one sequence"):
        start_llamacpp(MODEL_DIR, EngineOptions(max_model_len=256, kv_cache_tokens=128), python=llamacpp_interpreter)


def test_the_server_judges_prompts_whose_text_round_trips(llamacpp_interpreter: str, whole: BridgedEngine) -> None:
    # llama_cpp.server takes text prompts only: a canonical prompt (BOS, then the tokenizer's own
    # ids) round-trips through its /extras/tokenize and is answered as in-process; random ids do
    # not, and that request alone is refused, naming both id lists.
    canonical = EngineRequest(prompt=(433, 17, 10, 220), max_tokens=3, logprobs=2)  # "<|begin_of_text|>2+ "
    random_ids = EngineRequest(prompt=prompt(9, 2), max_tokens=3, logprobs=2)
    server = start_llamacpp_server(MODEL_DIR, EngineOptions(dtype="float32", max_model_len=256), python=llamacpp_interpreter)
    try:
        assert re.fullmatch(r"llama_cpp.server \(llama-cpp-python \d+\.\d+\.\d+, on 127.0.0.1\)", server.name)
        assert server.takes_text_prompts
        [served] = server.generate([canonical])
        with pytest.raises(Unsupported, match=r"does not tokenize back to its ids: the request's \[433, 2, 9,"):
            server.generate([random_ids])
    finally:
        server.stop()
    [alone] = whole.generate([canonical])
    assert served.token_ids == alone.token_ids and served.finish_reason == alone.finish_reason == "length"
    gaps = [abs(a.logprob - b.logprob) for a, b in zip(served.logprobs, alone.logprobs, strict=True)]
    assert max(gaps) <= PATHS_TOLERANCE and max(oracle_gaps(canonical, served)) <= ORACLE_TOLERANCE
