"""An OpenAI-compatible server as an EngineHandle: requests to ``/v1/completions`` bodies, answers back.

One HTTP request per engine request, sent together so that the server batches them. How the
answer reads depends on the :class:`Dialect` that ``connect`` found: vLLM's extras (tokens as
``token_id:N``, its own ``prompt_logprobs`` with ranks, ``top_k``, ``ignore_eos``) or the legacy
``echo`` (prompt positions first in the logprobs, the prompt's text first in the text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from infer_ref.conformance.engines.adapters.openai_client import EndpointError, HttpClient, ServerRefused
from infer_ref.conformance.engines.adapters.openai_text import PromptText
from infer_ref.conformance.engines.adapters.openai_tokens import TokenTable, order_top
from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.interface.contract import Unsupported

# How servers refuse a request longer than their context: vLLM ("This model's maximum context length
# is 256 tokens. However, you requested ..."), llama_cpp.server ("Requested tokens (8209) exceed
# context window of 2048").
_CONTEXT_TOO_SHORT = re.compile(r"maximum context length|context window|context length", re.IGNORECASE)


@dataclass(frozen=True)
class Dialect:
    """What the probe found the server to understand."""

    vllm_extras: bool  # tokens as ids, prompt_logprobs, top_k, ignore_eos honoured
    prompt_logprobs: str | None  # "vllm", "echo" or None (not offered)
    cached_tokens: bool  # usage.prompt_tokens_details.cached_tokens is reported
    text_prompts: bool = False  # prompts as text only (llama_cpp.server): openai_text.py's dialect


class OpenAIEngine:
    """An EngineHandle over ``/v1/completions``; :meth:`stop` forgets the server (it is not ours)."""

    def __init__(
        self,
        client: HttpClient,
        model: str,
        tokens: TokenTable,
        dialect: Dialect,
        capabilities: frozenset[str],
        name: str,
    ) -> None:
        self.client = client
        self.model = model
        self.tokens = tokens
        self.dialect = dialect
        self.capabilities = capabilities
        self.name = name
        self.on_stop: Callable[[], None] | None = None  # set by whoever started the server
        self.text_prompts: PromptText | None = None  # set by connect for a server of text prompts only

    @property
    def takes_text_prompts(self) -> bool:
        """The tier then draws text-stable prompts (engines/workloads/text_stable.py)."""
        return self.text_prompts is not None

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        bodies = [self.request_body(r) for r in requests]
        with ThreadPoolExecutor(max_workers=max(1, len(bodies))) as pool:  # together: the server batches
            try:
                answers = list(pool.map(lambda body: self.client.post("/completions", body), bodies))
            except ServerRefused as err:
                if err.status == 400 and _CONTEXT_TOO_SHORT.search(err.server_message):
                    # Started by someone else with a shorter context than the request (the long-context
                    # workload's 8448 positions): a setting of the server, not a wrong answer.
                    longest = max(len(r.prompt) + r.max_tokens for r in requests)
                    raise Unsupported(
                        f"{self.name} was started with a context shorter than {longest} positions "
                        f"({err.server_message[:200]})"
                    ) from None
                raise
        return [self.parse_answer(a, r) for a, r in zip(answers, requests, strict=True)]

    def reset_prefix_cache(self) -> None:
        self.client.post("/reset_prefix_cache", None, root=True)

    def stop(self) -> None:
        """Forget the server; one the kit launched is stopped by ``on_stop``."""
        if self.on_stop is not None:
            on_stop, self.on_stop = self.on_stop, None
            on_stop()

    def request_body(self, request: EngineRequest) -> dict[str, Any]:
        k = request.logprobs
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": self._prompt(request),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "logprobs": k,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if self.dialect.vllm_extras:
            body.update(return_tokens_as_token_ids=True, top_k=request.top_k, ignore_eos=request.ignore_eos)
        elif self.dialect.text_prompts:
            if request.ignore_eos:
                raise Unsupported(f"{self.name} takes no ignore_eos")
            # llama_cpp.server's own sampler fields; its defaults (repeat_penalty 1.1, min_p 0.05,
            # top_k 40) would change the chosen tokens, so they are set as the in-process adapter sets them
            body.update(top_k=request.top_k, repeat_penalty=1.0, min_p=0.0)
        elif request.top_k or request.ignore_eos:
            raise Unsupported(
                f"{self.name} takes neither top_k nor ignore_eos (OpenAI's completions API has neither)"
            )
        if request.prompt_logprobs is not None:
            if self.dialect.prompt_logprobs == "vllm":
                body["prompt_logprobs"] = request.prompt_logprobs
            elif (
                self.dialect.prompt_logprobs == "echo"
            ):  # one k for both: ask the larger, cut each to its own
                body.update(echo=True, logprobs=body_logprobs(request, self.dialect))
                # vLLM counts text_offset over the "token_id:N" strings when it answers ids, so the
                # prompt's text could not be cut off: echo answers token texts (the tokenizer maps them)
                body.pop("return_tokens_as_token_ids", None)
            else:
                raise Unsupported(
                    f"{self.name} returns no prompt logprobs (neither prompt_logprobs nor echo)"
                )
        return body

    def _prompt(self, request: EngineRequest) -> str | list[int]:
        if self.text_prompts is not None:
            return self.text_prompts.to_text(request.prompt)
        return list(request.prompt)

    def parse_answer(self, answer: dict[str, Any], request: EngineRequest) -> EngineOutput:
        try:
            return self._parse(answer, request)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise EndpointError(
                f"{self.client.endpoint} answered /completions in an unexpected shape "
                f"({type(err).__name__}: {err}): {json.dumps(answer)[:200]}"
            ) from None

    def _parse(self, answer: dict[str, Any], request: EngineRequest) -> EngineOutput:
        choice = answer["choices"][0]
        legacy = choice.get("logprobs")
        if not legacy or legacy.get("top_logprobs") is None:
            raise EndpointError(
                f"{self.client.endpoint} returned no logprobs: start it with logprobs allowed "
                "(vLLM: --max-logprobs 20)"
            )
        n_prompt = len(request.prompt)
        echoed = self.dialect.prompt_logprobs == "echo" and request.prompt_logprobs is not None
        skip = n_prompt if echoed else 0
        asked = body_logprobs(request, self.dialect)
        steps = [
            self._position(token, top, asked, request.logprobs)
            for token, top in zip(legacy["tokens"][skip:], legacy["top_logprobs"][skip:], strict=True)
        ]
        text = choice["text"]
        if echoed:  # the text starts with the prompt's; the first generated token's offset cuts it
            offsets = legacy["text_offset"]
            text = text[offsets[n_prompt] :] if len(offsets) > n_prompt else ""
        prompt = None
        if request.prompt_logprobs is not None:
            prompt = (
                self._prompt_positions_vllm(choice["prompt_logprobs"], request)
                if not echoed
                else (
                    None,
                    *(
                        self._position(t, top, asked, request.prompt_logprobs)
                        for t, top in zip(
                            legacy["tokens"][1:n_prompt], legacy["top_logprobs"][1:n_prompt], strict=True
                        )
                    ),
                )
            )
        finish = choice["finish_reason"]
        if finish not in ("stop", "length"):
            raise ValueError(f"finish_reason {finish!r}")
        if (
            self.dialect.text_prompts
            and finish == "stop"
            and not _stop_string_met(legacy["tokens"][skip:], request)
        ):
            raise Unsupported(
                f"{self.name} ended the request at an end-of-generation token it does not return "
                "(llama-cpp-python's create_completion drops it): which id is not known"
            )
        return EngineOutput(
            token_ids=tuple(step.token for step in steps),
            text=text,
            logprobs=tuple(steps),
            finish_reason=finish,
            prompt_logprobs=prompt,
            cached_tokens=self._cached_tokens(answer),
        )

    def _position(self, token: str, top: dict[str, float], asked: int, k: int) -> TokenLogprobs:
        chosen = self.tokens.to_id(token)
        entries = [(self.tokens.to_id(t), float(lp)) for t, lp in top.items()]
        chosen_logprob = dict(entries)[chosen]
        return TokenLogprobs(chosen, chosen_logprob, order_top(chosen, entries, asked, k))

    def _prompt_positions_vllm(
        self, positions: list[Any], request: EngineRequest
    ) -> tuple[TokenLogprobs | None, ...]:
        """vLLM's own format: ``None``, then per position ``{id: {logprob, rank, decoded_token}}``."""
        k = request.prompt_logprobs or 0
        out: list[TokenLogprobs | None] = [None]
        for given, entry in zip(request.prompt[1:], positions[1:], strict=True):
            ranked = sorted(
                (v["rank"], int(t), float(v["logprob"])) for t, v in entry.items() if v["rank"] <= k
            )
            out.append(
                TokenLogprobs(
                    given, float(entry[str(given)]["logprob"]), tuple((t, lp) for _, t, lp in ranked)
                )
            )
        return tuple(out)

    def _cached_tokens(self, answer: dict[str, Any]) -> int | None:
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        return int(cached) if self.dialect.cached_tokens and cached is not None else None


def _stop_string_met(token_texts: Sequence[str], request: EngineRequest) -> bool:
    """Whether the generated tokens' texts hold one of the request's stop strings (a stop string's
    tokens come back; an end-of-generation token does not)."""
    generated = "".join(token_texts)
    return any(stop in generated for stop in request.stop)


def body_logprobs(request: EngineRequest, dialect: Dialect) -> int:
    """The ``logprobs`` asked of the server: with ``echo`` one count serves prompt and generation."""
    if dialect.prompt_logprobs == "echo" and request.prompt_logprobs is not None:
        return max(request.logprobs, request.prompt_logprobs)
    return request.logprobs
