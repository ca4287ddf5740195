"""Sampling parameters: how to pick tokens and when to stop, checked when they are made.

Kept apart from the sampling functions (:mod:`infer_ref.sampling`, which need torch) so that a
command line refuses ``--temperature nan`` or ``--seed -1`` before torch is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer_ref.errors import UsageError

if TYPE_CHECKING:  # torch is imported where a generator is made, not to check the parameters
    import torch

__all__ = ["MAX_SEED", "SamplingParams"]


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
        import torch

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
