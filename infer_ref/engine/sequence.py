"""A request's state while it runs: its tokens, its sampling, its stopping rule, what it measured.

``generate()`` runs one :class:`Request`; the :class:`~infer_ref.engine.engine.Engine` runs many,
each also holding a :class:`~infer_ref.engine.block_manager.TokenSequence` (its block table and how many
of its positions are computed) for the block manager.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from infer_ref.engine.block_manager import TokenSequence
from infer_ref.results import GenerationTiming, TokenCollector, TokenDecoder
from infer_ref.sampling import SamplingParams


class NoText:
    """Token ids only (no tokenizer): text is empty (the engine refuses stop strings up front)."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return ""


@dataclass(eq=False)
class Request:
    """One request.

    Attributes:
        index: its place among the prompts of one call (results come back in this order).
        collector: prompt + generated tokens and the decision to stop (EOS, stop string, limit).
        generator: the request's own seeded generator (``params.make_generator()``), so its
            tokens do not depend on what runs beside it.
        forced: teacher forcing: the tokens it feeds instead of the ones it would choose.
        keep_logits: record the logits each token was chosen from in ``logits``.
        seq: its blocks as the engine's block manager sees them (None for ``generate()``).
        num_cached_tokens: prompt tokens served by a prefix hit when it was first admitted.
    """

    index: int
    params: SamplingParams
    collector: TokenCollector
    generator: torch.Generator | None
    forced: list[int] | None = None
    keep_logits: bool = False
    seq: TokenSequence | None = None
    logits: list[Tensor] = field(default_factory=list)
    timing: GenerationTiming = field(default_factory=GenerationTiming)
    num_cached_tokens: int | None = None
    num_preemptions: int = 0

    @classmethod
    def new(
        cls,
        index: int,
        prompt: Sequence[int],
        params: SamplingParams,
        tokenizer: TokenDecoder | None,
        eos_ids: Iterable[int],
        *,
        forced: list[int] | None = None,
        keep_logits: bool = False,
        on_token: Callable[[int], None] | None = None,
        with_blocks: bool = False,
    ) -> Request:
        """A request for ``prompt``; a forced one stops after its forced tokens (EOS is ignored)."""
        collector = TokenCollector(
            prompt,
            tokenizer or NoText(),
            max_new_tokens=params.max_new_tokens if forced is None else len(forced),
            stop=params.stop,
            eos_ids=() if forced is not None else eos_ids,
            on_token=on_token,
        )
        seq = TokenSequence(list(prompt)) if with_blocks else None
        return cls(index, params, collector, params.make_generator(), forced, keep_logits, seq)

    @property
    def step(self) -> int:
        """How many tokens it has generated: the index of the next one."""
        return len(self.collector.generated)

    def where(self) -> str:
        """The step and position the next token is chosen at, for error messages."""
        return f"step {self.step} (position {len(self.collector.tokens) - 1})"

    def accept(self, token: int) -> bool:
        """Record the chosen token; True when the request is done. A token it will feed next also
        joins its block sequence (the final one never is fed, so it never needs a position)."""
        done = self.collector.accept(token)
        if not done and self.seq is not None:
            self.seq.token_ids.append(token)
        return done


def model_eos_ids(config_eos: Iterable[int], tokenizer: object) -> set[int]:
    """Every id that ends generation: the model config's and the tokenizer's ``eos_token_ids``."""
    return set(config_eos) | set(getattr(tokenizer, "eos_token_ids", ()))
