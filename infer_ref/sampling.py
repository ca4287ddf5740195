"""Sampling parameters and next-token selection.

Order of operations (as in transformers' logits processors): repetition penalty, then greedy argmax
at temperature 0, else temperature, top-k, top-p, and a draw from a CPU ``torch.Generator`` so that
a seed gives the same tokens on every device and on the cached and uncached paths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from infer_ref.errors import UsageError
from infer_ref.validation import check_logits


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    Attributes:
        temperature: 0 selects greedy decoding; > 0 samples from ``softmax(logits / temperature)``.
        top_k: keep only the k most likely tokens (None: all).
        top_p: keep the smallest set of tokens whose probability reaches top_p (None: all).
        repetition_penalty: > 1 discourages tokens already in the context (CTRL-style, as in HF).
        seed: seed of the sampling generator, an integer in [0, 2**64) (None: nondeterministic).
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
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        problems = _problems(self)
        if problems:
            raise UsageError("invalid SamplingParams: " + "; ".join(problems))

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


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problems(p: SamplingParams) -> list[str]:
    """Every invalid field of ``p``, each with the value and what is expected (never coerced)."""
    problems = []
    if not _is_number(p.temperature) or p.temperature < 0:
        problems.append(f"temperature must be >= 0 and finite, got {p.temperature!r}")
    if p.top_k is not None and (not _is_int(p.top_k) or p.top_k < 1):
        problems.append(f"top_k must be a positive integer or None, got {p.top_k!r}")
    if p.top_p is not None and (not _is_number(p.top_p) or not 0 < p.top_p <= 1):
        problems.append(f"top_p must be in (0, 1] or None, got {p.top_p!r}")
    if not _is_number(p.repetition_penalty) or p.repetition_penalty <= 0:
        problems.append(f"repetition_penalty must be > 0 and finite, got {p.repetition_penalty!r}")
    if p.seed is not None and (not _is_int(p.seed) or not 0 <= p.seed <= MAX_SEED):
        problems.append(f"seed must be an integer in [0, 2**64 - 1] or None, got {p.seed!r}")
    if not _is_int(p.max_new_tokens) or p.max_new_tokens < 1:
        problems.append(f"max_new_tokens must be a positive integer, got {p.max_new_tokens!r}")
    if not isinstance(p.stop, tuple) or any(not isinstance(s, str) or not s for s in p.stop):
        problems.append(f"stop strings must be non-empty strings (a string or a list of them), got {p.stop!r}")
    return problems


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
    return filter_top_k_top_p(_scale(logits, params.temperature), params.top_k, params.top_p)


def sample_token(
    logits: Tensor,
    context: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    where: str = "the sampled position",
) -> int:
    """Choose the next token from ``logits`` ``[V]`` given the tokens so far.

    Logits that cannot decide a token (any NaN or +inf, or all -inf) raise
    :class:`~infer_ref.errors.NonFiniteError` naming ``where`` (a step and position), never token 0.
    """
    if logits.dim() != 1:
        raise ValueError(f"sample_token expects logits of shape [vocab], got {tuple(logits.shape)}")
    check_logits(logits, where=where)
    logits = warp_logits(logits.float(), context, params)
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())


def _scale(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature``; shifted by the maximum first when a tiny temperature would overflow.

    softmax is shift-invariant, so the shift changes nothing but the overflow: with it the best
    token scales to 0 and the others to large negatives or -inf, instead of inf - inf = NaN.
    Temperatures too small for float32 (which would round to 0) are applied in float64.
    """
    scaled = logits / temperature
    if bool(torch.isposinf(scaled).any()) or bool(torch.isnan(scaled).any()):
        wide = logits.double()  # float64: a temperature below float32's range would round to 0
        scaled = (wide - wide.max()) / temperature
    return scaled
