"""The OpenAI-compatible HTTP adapter against a stub server: the connect checks and the mapping of answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_stub import OTHER_LOGPROB, TABLE, Stub, StubServer

from infer_ref.conformance.engines.adapters.openai_client import EndpointError
from infer_ref.conformance.engines.adapters.openai_http import connect
from infer_ref.conformance.engines.adapters.openai_tokens import order_top
from infer_ref.conformance.engines.adapters.vllm_server import free_port
from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.interface.contract import Unsupported

MODEL_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"  # vocabulary 439
PROMPT = (433, 64, 87, 66)  # BOS, 'a', 'x' (not in the stub's table), 'c'


def expected_top(k: int) -> tuple[tuple[int, float], ...]:
    return tuple(TABLE[:k])


def test_an_endpoint_that_does_not_answer_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError) as caught:
        connect(url, MODEL_DIR, timeout=5)
    message = str(caught.value)
    assert message.startswith(f"no OpenAI-compatible server answers at {url} (") and "\n" not in message


def test_a_server_without_logprobs_is_refused() -> None:
    with StubServer(Stub(logprobs=False)) as url, pytest.raises(EndpointError, match="returned no logprobs"):
        connect(url, MODEL_DIR)


@pytest.mark.parametrize(
    ("stub", "expected"),
    [
        (Stub(id_shift=439), r"outside .*llama-tiny's vocabulary of 439: it serves another model"),
        (Stub(vocab_size=300), r"refuses token id 438 of .*llama-tiny's vocabulary \(439 tokens\): it serves another model"),
        (Stub(tokenize_shift=1), r"tokenizes text differently from .*tokenizer.json: it serves another model"),
    ],
    ids=["ids-beyond-the-vocabulary", "smaller-vocabulary", "other-tokenizer"],
)
def test_a_server_of_another_model_is_refused(stub: Stub, expected: str) -> None:
    with StubServer(stub) as url, pytest.raises(EndpointError, match=expected) as caught:
        connect(url, MODEL_DIR)
    assert "\n" not in str(caught.value)


def test_vllm_dialect_maps_ids_ranks_and_prompt_logprobs() -> None:
    server = StubServer(Stub(extras=True))
    with server as url:
        engine = connect(url, MODEL_DIR)
        assert engine.dialect.vllm_extras and engine.dialect.prompt_logprobs == "vllm"
        assert not engine.takes_text_prompts
        assert {"prompt_logprobs", "top_k_top_p", "seed", "stop_strings", "batch"} <= engine.capabilities
        [out] = engine.generate([EngineRequest(prompt=PROMPT, max_tokens=3, logprobs=2, prompt_logprobs=3)])
    assert out.token_ids == (64, 64, 64) and out.text == "aaa" and out.finish_reason == "length"
    assert all((s.token, s.logprob, s.top) == (64, -0.5, expected_top(2)) for s in out.logprobs)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert [(p.token, p.logprob, p.top) for p in out.prompt_logprobs[1:] if p is not None] == [
        (64, -0.5, expected_top(3)), (87, OTHER_LOGPROB, expected_top(3)), (66, -2.0, expected_top(3))]  # fmt: skip
    sent = server.requests[-1]
    assert sent["prompt"] == list(PROMPT) and sent["return_tokens_as_token_ids"] and sent["prompt_logprobs"] == 3


def test_echo_dialect_maps_token_texts_and_cuts_the_prompt_off() -> None:
    server = StubServer(Stub(extras=False))
    with server as url:
        engine = connect(url, MODEL_DIR)
        assert not engine.dialect.vllm_extras and engine.dialect.prompt_logprobs == "echo"
        assert "top_k_top_p" not in engine.capabilities
        [out] = engine.generate([EngineRequest(prompt=PROMPT[1:], max_tokens=2, logprobs=1, prompt_logprobs=4)])
    # the prompt's 'a', 'x', 'c' echoed first: the generated text is what follows them
    assert out.token_ids == (64, 64) and out.text == "aa"
    assert all((s.token, s.logprob, s.top) == (64, -0.5, expected_top(1)) for s in out.logprobs)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert [(p.token, p.logprob, p.top) for p in out.prompt_logprobs[1:] if p is not None] == [
        (87, OTHER_LOGPROB, expected_top(4)), (66, -2.0, expected_top(4))]  # fmt: skip
    sent = server.requests[-1]
    assert sent["echo"] is True and sent["logprobs"] == 4  # one count for both: the larger


def test_order_top_puts_the_chosen_token_at_its_rank_or_leaves_it_out() -> None:
    # chosen first, then the top-3 by rank; the chosen one (rank 2) is one of them: 3 entries
    assert order_top(7, [(7, -1.0), (5, -0.5), (9, -2.0)], 3, 3) == ((5, -0.5), (7, -1.0), (9, -2.0))
    # the chosen one is not among the top-2: it came on top of them (3 entries), and is left out
    assert order_top(7, [(7, -4.0), (5, -0.5), (9, -2.0)], 2, 2) == ((5, -0.5), (9, -2.0))
    # asked 4 (echo's larger count), kept 2
    assert order_top(5, [(5, -0.5), (9, -2.0), (7, -3.0), (8, -4.0)], 4, 2) == ((5, -0.5), (9, -2.0))


def test_a_server_that_takes_text_prompts_only_is_not_supported() -> None:
    # llama-cpp-python's server validates "prompt" as a string (or a list of strings).
    with StubServer(Stub(text_prompts_only=True)) as url, pytest.raises(Unsupported, match="takes prompts as text only .*HTTP 422") as info:
        connect(url, MODEL_DIR)
    assert "\n" not in str(info.value)


# llama_cpp.server's dialect: text prompts, checked through its /extras/tokenize (BOS first), token texts back.
ROUND_TRIPS = (433, 64, 330)  # "<|begin_of_text|>" then "a b": llama-tiny's tokenizer gives these ids back
SPLIT = (433, 64, 220, 65)  # "a", " ", "b": the same text, which the tokenizer gives back as "a", " b"


def test_text_prompts_only_server_judges_a_prompt_whose_text_round_trips() -> None:
    server = StubServer(Stub(extras=False, text_prompts_only=True, extras_tokenize=True))
    with server as url:
        engine = connect(url, MODEL_DIR)
        assert engine.dialect.text_prompts and "prompt_logprobs" not in engine.capabilities
        assert engine.takes_text_prompts  # the tier draws text-stable prompts for it
        [out] = engine.generate([EngineRequest(prompt=ROUND_TRIPS, max_tokens=2, logprobs=3)])
    assert out.token_ids == (64, 64) and out.finish_reason == "length"
    assert all((s.token, s.logprob, s.top) == (64, -0.5, expected_top(3)) for s in out.logprobs)
    sent = server.requests[-1]
    assert sent["prompt"] == "a b" and (sent["repeat_penalty"], sent["min_p"], sent["top_k"]) == (1.0, 0.0, 0)


def test_text_prompts_only_server_refuses_that_request_alone_when_its_text_does_not_round_trip() -> None:
    with StubServer(Stub(extras=False, text_prompts_only=True, extras_tokenize=True)) as url:
        engine = connect(url, MODEL_DIR)
        with pytest.raises(Unsupported, match=r"the request's \[433, 64, 220, 65\] became \[433, 64, 330\]") as info:
            engine.generate([EngineRequest(prompt=SPLIT, max_tokens=1, logprobs=1)])
        with pytest.raises(Unsupported, match=r"the request's \[64, 330\] became \[433, 64, 330\]"):
            engine.generate([EngineRequest(prompt=ROUND_TRIPS[1:], max_tokens=1, logprobs=1)])  # the BOS it adds
        [out] = engine.generate([EngineRequest(prompt=ROUND_TRIPS, max_tokens=1, logprobs=1)])  # the next is judged
    assert "\n" not in str(info.value) and out.token_ids == (64,)


def test_text_prompts_only_server_refuses_a_token_text_several_tokens_render_to() -> None:
    # an empty text: a control token (rendered without its text) or bytes that are no valid UTF-8
    with StubServer(Stub(extras=False, text_prompts_only=True, extras_tokenize=True, empty_text_top=True)) as url:
        engine = connect(url, MODEL_DIR)
        with pytest.raises(Unsupported, match="the engine answered the token text '', which several of .* its id is not known exactly"):
            engine.generate([EngineRequest(prompt=ROUND_TRIPS, max_tokens=1, logprobs=3)])


def test_a_request_longer_than_the_servers_context_is_not_supported() -> None:
    """A server started by someone else with a shorter context than the long-context workload's
    requests refuses them (HTTP 400): a setting of the server, "not supported" with its sentence."""
    with StubServer(Stub(extras=True, max_context=64)) as url:
        engine = connect(url, MODEL_DIR)
        [short] = engine.generate([EngineRequest(prompt=PROMPT, max_tokens=3)])
        with pytest.raises(Unsupported, match=r"context shorter than 103 positions .*maximum context length is 64"):
            engine.generate([EngineRequest(prompt=PROMPT * 25, max_tokens=3)])
    assert short.token_ids == (64, 64, 64)


def test_only_a_context_refusal_is_read_as_not_supported() -> None:
    from infer_ref.conformance.engines.adapters.openai_engine import _CONTEXT_TOO_SHORT

    assert _CONTEXT_TOO_SHORT.search("Requested tokens (8209) exceed context window of 2048")  # llama_cpp.server
    assert not _CONTEXT_TOO_SHORT.search("token id out of vocabulary (300)")  # any other 400 stays an error
