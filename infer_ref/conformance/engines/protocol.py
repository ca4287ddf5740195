"""The black-box engine protocol: what the engine tier asks of any engine with a generate API.

An engine is judged only through what it shows its users: it is started on a Hugging Face
checkpoint folder with :class:`EngineOptions`, runs lists of :class:`EngineRequest` (prompt token
ids in, per request an :class:`EngineOutput` out: tokens, text, per-step top-k logprobs, prompt
logprobs, finish reason, cached prompt tokens), resets its prefix cache where it can, and stops.
Nothing of its internals is read: the oracle (transformers in float64 on the same folder) and the
engine's own answers under different schedules are what it is compared with.

An adapter is a factory ``(model_dir, options) -> EngineHandle``. What an engine lacks it declares:
a capability missing from :attr:`EngineHandle.capabilities` skips the properties that need it as
"not supported", and an option it cannot honour makes the factory raise
:class:`~infer_ref.conformance.interface.contract.Unsupported`, never a silently different engine.

An engine that takes prompts as text only (it tokenizes them itself) says so with a true
``takes_text_prompts`` attribute on its factory or handle: the tier then draws prompts whose text
the folder's tokenizer turns back into the same ids (``text_stable.py``), and the adapter raises
``Unsupported`` for any prompt the engine's own tokenizer would change.

An engine whose low-precision recipe differs on purpose from transformers' in a way the legitimate
ensemble holds (``engines/recipes.py``, ``LEGITIMATE``) says so with a ``recipe_differences``
attribute on its factory: ``{recipe name: why}``. The recipe verdict then names the difference, and
its measured size, on the checkpoints where it changes results (docs/low-precision.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

# What an engine may declare (EngineHandle.capabilities). A property needing one that is missing is
# reported "not supported by <engine>".
CAPABILITIES = (
    "prompt_logprobs",  # EngineRequest.prompt_logprobs is honoured
    "seed",  # a seeded sampled request is reproducible
    "stop_strings",  # EngineRequest.stop is honoured
    "prefix_caching",  # EngineOptions.prefix_caching=True reuses computed prefixes
    "cached_tokens",  # EngineOutput.cached_tokens is reported
    "reset_prefix_cache",  # EngineHandle.reset_prefix_cache empties the prefix cache
    "chunked_prefill",  # EngineOptions.max_num_batched_tokens splits a long prompt's prefill
    "kv_budget",  # EngineOptions.kv_cache_tokens bounds the KV cache (small budgets preempt)
    "block_size",  # EngineOptions.block_size sets the KV block size (an engine may refuse sizes it lacks)
    "batch",  # several requests in one generate call run concurrently
    "top_k_top_p",  # EngineRequest.top_k / top_p are honoured
    "ignore_eos",  # EngineRequest.ignore_eos is honoured
    "top_logprobs",  # EngineRequest.logprobs alternatives come back (without it: the chosen token's only)
)

FinishReason = Literal["stop", "length"]
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is started. ``None`` leaves a setting at the engine's default.

    Attributes:
        dtype: the weights' and activations' dtype (``float32`` is the tier's default: an engine's
            logprobs are then judged at float32 tolerances).
        prefix_caching: reuse the K/V of prompts computed before.
        block_size: positions per KV block (paged engines; vLLM's CPU backend needs a multiple of 32).
        max_num_batched_tokens: tokens one scheduler step may compute (a chunked-prefill budget).
        max_num_seqs: requests running at once.
        kv_cache_tokens: positions the KV cache holds in all; small enough, it forces preemption.
        max_model_len: the longest prompt + generation the engine must accept.
    """

    dtype: str = "float32"
    prefix_caching: bool = True
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in (
            "block_size",
            "max_num_batched_tokens",
            "max_num_seqs",
            "kv_cache_tokens",
            "max_model_len",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


@dataclass(frozen=True)
class EngineRequest:
    """One request, prompt given as token ids (so every engine sees the same tokens).

    Attributes:
        prompt: token ids, at least one.
        max_tokens: tokens to generate at most (at least 1).
        temperature: 0 is greedy.
        seed: the request's own sampling seed (None: the engine's).
        top_k: 0 disables; top_p: 1.0 disables.
        stop: strings that end generation at their earliest occurrence in the generated text
            (excluded from the text, as OpenAI-compatible servers do).
        ignore_eos: keep generating past an EOS token.
        logprobs: top logprobs per generated token (the chosen token's own logprob always comes too).
        prompt_logprobs: top logprobs per prompt position (None: none asked; position 0 has none).
    """

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    top_k: int = 0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 5
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.prompt
        ):
            raise ValueError(
                f"prompt must be a non-empty tuple of token ids (ints >= 0), got {self.prompt!r}"
            )
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.logprobs < 0 or (self.prompt_logprobs is not None and self.prompt_logprobs < 0):
            raise ValueError(
                f"logprobs and prompt_logprobs must be >= 0, got {self.logprobs!r}, {self.prompt_logprobs!r}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class TokenLogprobs:
    """What an engine says about one position: the token there and the top alternatives.

    Attributes:
        token: the token chosen (generated) or given (prompt) at this position.
        logprob: ``token``'s log-probability.
        top: the engine's top-k as ``(token, logprob)`` pairs, in the order the engine returned them.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class EngineOutput:
    """One request's answer.

    Attributes:
        token_ids: generated tokens (a stop string's tokens included as the engine returns them).
        text: generated text, cut before the stop string that ended it.
        logprobs: one entry per generated token.
        prompt_logprobs: one entry per prompt position when asked: ``None`` for position 0 (nothing
            precedes it), then the logprobs of prompt token ``i`` given tokens ``< i``.
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (max_tokens).
        cached_tokens: prompt tokens the engine served from its prefix cache (None: not reported).
    """

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...]
    finish_reason: FinishReason
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    cached_tokens: int | None = None


@runtime_checkable
class EngineHandle(Protocol):
    """A started engine."""

    name: str  # e.g. "vllm 0.32.0 (offline)"
    capabilities: frozenset[str]

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        """Run ``requests`` together (as one batch where the engine batches) and return their
        answers in order."""
        ...

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (only called when ``reset_prefix_cache`` is a capability)."""
        ...

    def stop(self) -> None:
        """Release everything the engine holds (processes, ports, memory); idempotent."""
        ...


class EngineFactory(Protocol):
    """``--engine module:FACTORY``: start an engine on a checkpoint folder."""

    def __call__(self, model_dir: Path, options: EngineOptions) -> EngineHandle: ...


__all__ = [
    "CAPABILITIES",
    "EngineFactory",
    "EngineHandle",
    "EngineOptions",
    "EngineOutput",
    "EngineRequest",
    "FinishReason",
    "TokenLogprobs",
]
