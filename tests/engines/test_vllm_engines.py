"""vLLM on the llama-tiny fixture, offline and through its own server: every logprob against a float64
oracle computed here, the two paths against each other, and a KV budget that really preempts."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine, EngineWorkerError
from infer_ref.conformance.engines.adapters.vllm import start_vllm
from infer_ref.conformance.engines.adapters.vllm_server import start_vllm_server
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.conformance.profiles import one_thread

pytestmark = pytest.mark.vllm

MODEL_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"
BLOCK = 32
OPTIONS = EngineOptions(dtype="float32", block_size=BLOCK, max_model_len=256)
# float32 engine vs float64 oracle on a 2-layer model: measured differences are about 1e-6.
ORACLE_TOLERANCE = 1e-4
# The two paths run the same kernels; only how requests are grouped into steps may differ.
PATHS_TOLERANCE = 1e-5


def prompt(length: int, start: int) -> tuple[int, ...]:
    return (433, *((start + 7 * i) % 430 for i in range(length - 1)))  # BOS, then ids below the specials


REQUESTS = [
    EngineRequest(prompt=prompt(BLOCK + 9, 3), max_tokens=12, logprobs=5, prompt_logprobs=5),  # crosses a block
    EngineRequest(prompt=prompt(5, 40), max_tokens=8, logprobs=3),
    EngineRequest(prompt=prompt(BLOCK, 11), max_tokens=BLOCK + 2, logprobs=2, prompt_logprobs=1, ignore_eos=True),
    # greedy from this prompt the fixture writes "77 = 2, 2": the stop string cuts it at " ="
    EngineRequest(prompt=(433, 5, 6, 7, 8), max_tokens=8, logprobs=1, stop=(" =",)),
    EngineRequest(prompt=prompt(9, 2), max_tokens=10, temperature=1.0, seed=7, top_k=20, top_p=0.9, logprobs=2),
]
STOPPED, SAMPLED = 3, 4


@pytest.fixture(scope="module")
def oracle() -> Iterator[torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    with one_thread():  # the module's float64 oracle on one thread
        yield AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float64).eval()


def oracle_logprobs(model: torch.nn.Module, tokens: Sequence[int]) -> torch.Tensor:
    """Row i: float64 log-softmax of the next token after ``tokens[: i + 1]``."""
    with torch.no_grad():
        logits = model(torch.tensor([list(tokens)])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def oracle_gaps(model: torch.nn.Module, request: EngineRequest, output: EngineOutput) -> list[float]:
    """|engine - oracle| for every logprob the engine returned, teacher-forced on its own tokens."""
    rows = oracle_logprobs(model, (*request.prompt, *output.token_ids))
    gaps: list[float] = []
    positions = [(len(request.prompt) - 1 + j, step) for j, step in enumerate(output.logprobs)]
    positions += [(i - 1, step) for i, step in enumerate(output.prompt_logprobs or ()) if step is not None]
    for row, step in positions:
        for token, logprob in ((step.token, step.logprob), *step.top):
            gaps.append(abs(logprob - float(rows[row, token])))
    return gaps


@pytest.fixture(scope="module")
def offline(vllm_interpreter: str) -> Iterator[BridgedEngine]:
    engine = start_vllm(MODEL_DIR, OPTIONS, python=vllm_interpreter)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def server(vllm_interpreter: str) -> Iterator[EngineHandle]:
    engine = start_vllm_server(MODEL_DIR, OPTIONS, python=vllm_interpreter)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def offline_answers(offline: BridgedEngine) -> list[EngineOutput]:
    return offline.generate(REQUESTS)


@pytest.fixture(scope="module")
def server_answers(server: EngineHandle) -> list[EngineOutput]:
    return server.generate(REQUESTS)


def check_against_oracle(model: torch.nn.Module, answers: list[EngineOutput]) -> None:
    for request, output in zip(REQUESTS, answers, strict=True):
        assert len(output.logprobs) == len(output.token_ids) and len(output.token_ids) >= 1
        if request.prompt_logprobs is not None:
            assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(request.prompt)
            assert output.prompt_logprobs[0] is None
        gaps = oracle_gaps(model, request, output)
        assert gaps and max(gaps) <= ORACLE_TOLERANCE, f"max |vLLM - oracle| = {max(gaps):.2e} for {request}"


def test_offline_logprobs_match_the_float64_oracle(oracle: torch.nn.Module, offline_answers: list[EngineOutput]) -> None:
    check_against_oracle(oracle, offline_answers)
    assert len(offline_answers[2].token_ids) == BLOCK + 2, "ignore_eos with max_tokens generates exactly max_tokens"


def test_stop_strings_and_seeds_reach_vllm(offline: BridgedEngine, offline_answers: list[EngineOutput]) -> None:
    stopped = offline_answers[STOPPED]
    assert (stopped.text, stopped.finish_reason) == ("77", "stop")
    again = offline.generate([REQUESTS[SAMPLED], REQUESTS[SAMPLED]])
    assert again[0].token_ids == again[1].token_ids == offline_answers[SAMPLED].token_ids


def test_server_logprobs_match_the_float64_oracle(oracle: torch.nn.Module, server_answers: list[EngineOutput]) -> None:
    check_against_oracle(oracle, server_answers)


def test_offline_and_server_answers_are_equal(offline_answers: list[EngineOutput],
                                              server_answers: list[EngineOutput]) -> None:  # fmt: skip
    for here, there in zip(offline_answers, server_answers, strict=True):
        assert (here.token_ids, here.text, here.finish_reason) == (there.token_ids, there.text, there.finish_reason)
        for mine, theirs in zip(here.logprobs, there.logprobs, strict=True):
            assert mine.token == theirs.token and [t for t, _ in mine.top] == [t for t, _ in theirs.top]
            values = zip((mine.logprob, *(lp for _, lp in mine.top)), (theirs.logprob, *(lp for _, lp in theirs.top)),
                         strict=True)  # fmt: skip
            assert all(abs(a - b) <= PATHS_TOLERANCE for a, b in values)
        assert (here.prompt_logprobs is None) == (there.prompt_logprobs is None)
        for mine_p, theirs_p in zip(here.prompt_logprobs or (), there.prompt_logprobs or (), strict=True):
            assert (mine_p is None) == (theirs_p is None)
            if mine_p is not None and theirs_p is not None:
                assert mine_p.token == theirs_p.token and abs(mine_p.logprob - theirs_p.logprob) <= PATHS_TOLERANCE
                assert [t for t, _ in mine_p.top] == [t for t, _ in theirs_p.top]


def test_prefix_cache_hits_are_reported_and_reset(offline: BridgedEngine) -> None:
    request = EngineRequest(prompt=prompt(2 * BLOCK + 5, 19), max_tokens=2)  # no prompt logprobs: the cache is read
    cold = offline.generate([request])[0]
    warm = offline.generate([request])[0]
    offline.reset_prefix_cache()
    after_reset = offline.generate([request])[0]
    assert (cold.cached_tokens, warm.cached_tokens, after_reset.cached_tokens) == (0, 2 * BLOCK, 0)
    assert warm.token_ids == cold.token_ids


def test_a_small_kv_budget_preempts_and_answers_stay_right(vllm_interpreter: str, oracle: torch.nn.Module) -> None:
    # 4 blocks of 32 for 3 requests that each grow to 3 blocks: vLLM must preempt to finish them.
    budget = EngineOptions(dtype="float32", block_size=BLOCK, kv_cache_tokens=4 * BLOCK, max_model_len=4 * BLOCK,
                           prefix_caching=False)  # fmt: skip
    requests = [EngineRequest(prompt=prompt(40, s), max_tokens=50, logprobs=2, ignore_eos=True) for s in (5, 6, 7)]
    engine = start_vllm(MODEL_DIR, budget, python=vllm_interpreter)
    try:
        answers = engine.generate(requests)
        preemptions = engine.call("stats")["preemptions"]
    finally:
        engine.stop()
    assert preemptions > 0, "the KV budget did not force a preemption (vLLM's num_preemptions counter is 0)"
    for request, output in zip(requests, answers, strict=True):
        assert len(output.token_ids) == 50
        assert max(oracle_gaps(oracle, request, output)) <= ORACLE_TOLERANCE


@pytest.mark.parametrize("start", [start_vllm, start_vllm_server], ids=["offline", "server"])
def test_a_block_size_the_cpu_backend_cannot_use_is_unsupported(vllm_interpreter: str, start: object) -> None:
    options = EngineOptions(block_size=16)
    with pytest.raises(Unsupported, match="vllm.*: vLLM's CPU backend needs a KV block size that is a multiple of 32, got 16"):
        start(MODEL_DIR, options, python=vllm_interpreter)  # type: ignore[operator]


def test_a_folder_vllm_cannot_load_is_one_line(vllm_interpreter: str, tmp_path: Path) -> None:
    config = json.loads((MODEL_DIR / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(EngineWorkerError) as caught:
        start_vllm(tmp_path, OPTIONS, python=vllm_interpreter)
    message = str(caught.value)
    assert message.startswith("vllm: start failed: ") and "\n" not in message and "(log: " in message
