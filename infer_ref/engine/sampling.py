"""Sampling parameters and next-token selection.

Order of operations (as in transformers' logits processors): repetition penalty, then greedy argmax
at temperature 0, else temperature, top-k, top-p, and a draw from a CPU ``torch.Generator`` so that
a seed gives the same tokens on every device and on the cached and uncached paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    Attributes:
        temperature: 0 selects greedy decoding; > 0 samples from ``softmax(logits / temperature)``.
        top_k: keep only the k most likely tokens (None: all).
        top_p: keep the smallest set of tokens whose probability reaches top_p (None: all).
        repetition_penalty: > 1 discourages tokens already in the context (CTRL-style, as in HF).
        seed: seed of the sampling generator (None: nondeterministic).
        max_new_tokens: most tokens to generate, EOS included.
        stop: strings that end generation; the text is cut before the first one found.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        problems = []
        if not self.temperature >= 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            problems.append(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if not self.repetition_penalty > 0:
            problems.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            problems.append(f"stop strings must be non-empty strings, got {self.stop!r}")
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        generator = torch.Generator(device="cpu")
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def apply_repetition_penalty(logits: Tensor, context: Sequence[int], penalty: float) -> Tensor:
    """Divide positive logits (multiply negative ones) of tokens seen in ``context`` by ``penalty``."""
    if penalty == 1.0 or not context:
        return logits
    ids = torch.tensor(sorted(set(context)), device=logits.device)
    seen = logits[ids]
    out = logits.clone()
    out[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return out


def filter_top_k_top_p(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Set every logit outside the top-k / top-p set to -inf (``logits`` is ``[V]``)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - top_p
        drop_sorted[-1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def warp_logits(logits: Tensor, context: Sequence[int], params: SamplingParams) -> Tensor:
    """The logits ``[V]`` a token is drawn from, in ``logits``' dtype: repetition penalty, then
    (unless greedy) temperature, top-k and top-p, with -inf outside the kept support."""
    logits = apply_repetition_penalty(logits, context, params.repetition_penalty)
    if params.greedy:
        return logits
    return filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)


def sample_token(
    logits: Tensor,
    context: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> int:
    """Choose the next token from ``logits`` ``[V]`` given the tokens so far."""
    if logits.dim() != 1:
        raise ValueError(f"sample_token expects logits of shape [vocab], got {tuple(logits.shape)}")
    logits = warp_logits(logits.float(), context, params)
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())
