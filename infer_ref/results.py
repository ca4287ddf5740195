"""What a generation request produces, and the one place that decides when it stops.

Both decode loops (the runner's eager one and its captured greedy one, ``infer_ref/engine/readback.py``)
feed their tokens to a :class:`TokenCollector`, so EOS, stop strings, the length limit and the
text of the result follow one rule whichever path ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

FinishReason = Literal["length", "eos", "stop"]


class TokenDecoder(Protocol):
    """The part of a tokenizer that generation uses."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


def generated_text(tokenizer: TokenDecoder, ids: Sequence[int]) -> str:
    """The text of generated ``ids``, special tokens dropped.

    A model whose embedding table is larger than its tokenizer (a vocabulary padded to a round size,
    as Qwen's is) can sample an id that no text belongs to. It stays in the token ids and adds no
    text, as transformers' ``decode`` treats it; the tokenizer's own ``decode`` refuses such ids,
    because from a caller they are a mistake."""
    size = getattr(tokenizer, "vocab_size", None)
    known = [i for i in ids if size is None or i < size]
    return tokenizer.decode(known, skip_special_tokens=True)


@dataclass
class GenerationTiming:
    prefill_time_s: float = 0.0
    decode_times_s: list[float] = field(default_factory=list)  # one per decode forward

    @property
    def decode_time_s(self) -> float:
        return sum(self.decode_times_s)

    @property
    def total_time_s(self) -> float:
        return self.prefill_time_s + self.decode_time_s


@dataclass
class GenerationResult:
    """Output of ``generate``.

    ``token_ids`` are the generated tokens, an EOS token included when that ended generation (as
    transformers returns it); ``text`` is their decoding without special tokens, cut before a stop
    string when one ended it.
    """

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    timing: GenerationTiming
    cache_memory_bytes: int | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


class TokenCollector:
    """The tokens of one request and the decision to stop: an EOS id, a stop string, or the limit."""

    def __init__(
        self,
        prompt_token_ids: Sequence[int],
        tokenizer: TokenDecoder,
        *,
        max_new_tokens: int,
        stop: Sequence[str],
        eos_ids: Iterable[int],
        on_token: Callable[[int], None] | None = None,
    ) -> None:
        self.tokens = [int(t) for t in prompt_token_ids]  # prompt + generated: the sampling context
        self.prompt_tokens = len(self.tokens)
        self.generated: list[int] = []
        self.finish: FinishReason = "length"
        self._tokenizer = tokenizer
        self._max_new_tokens = max_new_tokens
        self._stop = tuple(stop)
        self._eos_ids = frozenset(eos_ids)
        self._on_token = on_token
        self._text: str | None = None  # set when a stop string cut it

    def accept(self, token: int) -> bool:
        """Record ``token``; True when generation must stop."""
        self.tokens.append(token)
        self.generated.append(token)
        if self._on_token is not None:
            self._on_token(token)
        if token in self._eos_ids:
            self.finish = "eos"
            return True
        if self._stop:
            text = generated_text(self._tokenizer, self.generated)
            cut = first_stop(text, self._stop)
            if cut is not None:
                self._text, self.finish = text[:cut], "stop"
                return True
        return len(self.generated) >= self._max_new_tokens

    def result(self, timing: GenerationTiming, cache_memory_bytes: int | None) -> GenerationResult:
        text = self._text if self._text is not None else generated_text(self._tokenizer, self.generated)
        return GenerationResult(
            token_ids=self.generated,
            text=text,
            finish_reason=self.finish,
            prompt_tokens=self.prompt_tokens,
            timing=timing,
            cache_memory_bytes=cache_memory_bytes,
        )
