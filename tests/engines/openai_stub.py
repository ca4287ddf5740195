"""A tiny OpenAI-compatible server on 127.0.0.1 for the HTTP adapter's tests, with a model of stated answers.

Its "model" gives every position the same distribution, :data:`TABLE` (tokens 'a'..'f' of the
llama-tiny fixture's tokenizer, best first); a prompt token not in it has logprob
:data:`OTHER_LOGPROB`. Greedy generation therefore repeats 'a'. The answers follow vLLM's layout
(the chosen token first in each ``top_logprobs``, then the top-k, the chosen one added beyond them
when it is not one of them). ``Stub`` switches decide how it misbehaves.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

TABLE = [(64, -0.5), (65, -1.25), (66, -2.0), (67, -3.0), (68, -4.0), (69, -5.0)]  # 'a'..'f'
TEXT = {64: "a", 65: "b", 66: "c", 67: "d", 68: "e", 69: "f", 87: "x"}  # as the fixture's tokenizer decodes them
OTHER_LOGPROB = -9.5
MODEL = "stub-model"


@dataclass
class Stub:
    extras: bool = True  # honour return_tokens_as_token_ids and prompt_logprobs (as vLLM does)
    logprobs: bool = True  # answer logprobs at all
    vocab_size: int = 439  # prompts with a token id at or above it are refused (HTTP 400)
    id_shift: int = 0  # answer token ids shifted by this (another model's vocabulary)
    tokenize_shift: int = 0  # /tokenize answers ids shifted by this (another tokenizer)
    text_prompts_only: bool = False  # refuse token-id prompts (HTTP 422), answer text ones (llama_cpp.server)
    extras_tokenize: bool = False  # offer /extras/tokenize (BOS first, as llama_cpp.server) and answer token texts
    empty_text_top: bool = False  # an empty token text among the top logprobs (a control token, rendered empty)
    max_context: int | None = None  # refuse (HTTP 400, as vLLM words it) a prompt + max_tokens longer than this


BOS = 433  # llama-tiny's <|begin_of_text|>, which llama_cpp.server puts before a text prompt
TOKENIZER = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny" / "tokenizer.json"


def server_tokens(text: str) -> list[int]:
    """The stub's tokenizer: llama-tiny's, after a BOS (llama_cpp.server's /extras/tokenize)."""
    return [BOS, *Tokenizer.from_file(str(TOKENIZER)).encode(text, add_special_tokens=False).ids]


def text_completion(stub: Stub, body: dict[str, Any]) -> dict[str, Any]:
    """llama_cpp.server's layout: token texts, top logprobs keyed by text, the chosen one last."""
    k = int(body.get("logprobs") or 0)
    prompt = server_tokens(body["prompt"])[1:] if body.get("echo") else []  # the BOS is not echoed
    shown = [*prompt, *[TABLE[0][0]] * int(body["max_tokens"])]
    tops: list[dict[str, float] | None] = []
    for t in shown:
        top = {TEXT[u]: lp for u, lp in TABLE[:k]}
        if stub.empty_text_top:
            top = {"": -0.25, **top}
        top[TEXT.get(t, f"<{t}>")] = logprob_of(t)
        tops.append(top)
    logprobs = {"tokens": [TEXT.get(t, f"<{t}>") for t in shown], "token_logprobs": [logprob_of(t) for t in shown],
                "top_logprobs": tops, "text_offset": list(range(len(shown)))}  # fmt: skip
    choice = {"index": 0, "text": "a" * int(body["max_tokens"]), "finish_reason": "length", "logprobs": logprobs}
    return {"id": "cmpl-stub", "object": "text_completion", "model": MODEL, "choices": [choice]}


def logprob_of(token: int) -> float:
    return dict(TABLE).get(token, OTHER_LOGPROB)


def legacy_position(token: int, k: int, as_ids: bool, shift: int) -> tuple[str, float, dict[str, float]]:
    def name(t: int) -> str:
        return f"token_id:{t + shift}" if as_ids else TEXT.get(t, f"<{t}>")

    top = {name(token): logprob_of(token)}
    for t, lp in TABLE[:k]:
        top.setdefault(name(t), lp)
    return name(token), logprob_of(token), top


def completion(stub: Stub, body: dict[str, Any]) -> dict[str, Any]:
    prompt: list[int] = body["prompt"]
    k = int(body.get("logprobs") or 0)
    as_ids = stub.extras and bool(body.get("return_tokens_as_token_ids"))
    generated = [TABLE[0][0]] * int(body["max_tokens"])
    echo = bool(body.get("echo"))
    shown = [*prompt, *generated] if echo else generated
    positions = [legacy_position(t, k, as_ids, stub.id_shift) for t in shown]
    tokens = [p[0] for p in positions]
    token_logprobs: list[float | None] = [p[1] for p in positions]
    tops: list[dict[str, float] | None] = [p[2] for p in positions]
    if echo:  # nothing precedes the first prompt token
        token_logprobs[0], tops[0] = None, None
    text = "".join(TEXT.get(t, f"<{t}>") for t in shown)
    offsets = [sum(len(TEXT.get(t, f"<{t}>")) for t in shown[:i]) for i in range(len(shown))]
    choice: dict[str, Any] = {
        "index": 0, "text": text, "finish_reason": "length",
        "logprobs": {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
        if stub.logprobs and "logprobs" in body else None,
    }  # fmt: skip
    if stub.extras and body.get("prompt_logprobs") is not None:
        kp = int(body["prompt_logprobs"])
        choice["prompt_logprobs"] = [None] + [
            {str(t): {"logprob": lp, "rank": r, "decoded_token": TEXT.get(t, "?")}
             for r, (t, lp) in [(_rank(given), (given, logprob_of(given))), *((i + 1, e) for i, e in enumerate(TABLE[:kp]))]}
            for given in prompt[1:]
        ]  # fmt: skip
    return {"id": "cmpl-stub", "object": "text_completion", "model": MODEL, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated)}}  # fmt: skip


def _rank(token: int) -> int:
    ranks = {t: i + 1 for i, (t, _) in enumerate(TABLE)}
    return ranks.get(token, len(TABLE) + 1)


class StubServer:
    """``with StubServer(Stub(...)) as url:`` serves on a free port of 127.0.0.1; ``url`` ends in /v1."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.requests: list[dict[str, Any]] = []
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "owned_by": "stub"}]})
                else:
                    self._send(404, {"error": {"message": "Not Found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                server.requests.append({"path": self.path, **body})
                stub = server.stub
                if self.path == "/extras/tokenize" and stub.extras_tokenize:
                    self._send(200, {"tokens": server_tokens(body["input"])})
                elif self.path == "/v1/completions" and stub.text_prompts_only:
                    if isinstance(body["prompt"], str) and stub.extras_tokenize:
                        self._send(200, text_completion(stub, body))
                    elif isinstance(body["prompt"], str):
                        self._send(200, {"choices": [{"index": 0, "text": "a", "finish_reason": "length"}]})
                    else:
                        self._send(422, {"detail": [{"loc": ["body", "prompt"], "msg": "Input should be a valid string"}]})
                elif self.path == "/v1/completions":
                    asked = len(body["prompt"]) + body["max_tokens"]
                    if stub.max_context is not None and asked > stub.max_context:
                        self._send(400, {"error": {"message": f"This model's maximum context length is {stub.max_context} tokens. "
                                                              f"However, you requested {asked} tokens."}})  # fmt: skip
                    elif any(t >= stub.vocab_size for t in body["prompt"]):
                        self._send(400, {"error": {"message": f"token id out of vocabulary ({stub.vocab_size})"}})
                    else:
                        self._send(200, completion(stub, body))
                elif self.path == "/tokenize":
                    ids = [ord(c) - ord("a") + 64 + stub.tokenize_shift for c in body["prompt"] if c.isalpha()]
                    self._send(200, {"tokens": ids}) if stub.tokenize_shift else self._send(404, {"detail": "Not Found"})
                else:
                    self._send(404, {"detail": "Not Found"})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
