"""Requests and outputs as plain JSON-ready dicts: how a worker in another interpreter sees them.

The dicts mirror :class:`EngineRequest` and :class:`EngineOutput` field for field (tuples become
lists, a :class:`TokenLogprobs` becomes ``{"token", "logprob", "top": [[token, logprob], ...]}``).
Reading one back checks its shape, so a worker that answers nonsense fails loudly here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest, TokenLogprobs

FINISH_REASONS = ("stop", "length")


def request_to_dict(request: EngineRequest) -> dict[str, Any]:
    return asdict(request)


def output_from_dict(data: dict[str, Any]) -> EngineOutput:
    """An :class:`EngineOutput` from its dict; KeyError/TypeError/ValueError name what is wrong."""
    finish = data["finish_reason"]
    if finish not in FINISH_REASONS:
        raise ValueError(f"finish_reason {finish!r} is not one of {FINISH_REASONS}")
    prompt = data.get("prompt_logprobs")
    cached = data.get("cached_tokens")
    return EngineOutput(
        token_ids=tuple(_token(t) for t in data["token_ids"]),
        text=_text(data["text"]),
        logprobs=tuple(position_from_dict(p) for p in data["logprobs"]),
        finish_reason=finish,
        prompt_logprobs=None
        if prompt is None
        else tuple(None if p is None else position_from_dict(p) for p in prompt),
        cached_tokens=None if cached is None else _token(cached),
    )


def position_from_dict(data: dict[str, Any]) -> TokenLogprobs:
    return TokenLogprobs(
        token=_token(data["token"]),
        logprob=_number(data["logprob"]),
        top=tuple((_token(token), _number(logprob)) for token, logprob in data["top"]),
    )


def _token(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a non-negative integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value
