"""Prompts for an engine that takes text only: token ids whose text tokenizes back to exactly them.

An engine behind a text-only API (llama_cpp.server) tokenizes each prompt itself, so the tier can
judge a request only where the prompt's text gives its ids back. Random ids rarely do: adjacent
pieces merge (``"ab" + "c"`` becomes ``"abc"``) or split otherwise. :class:`TextStable` draws ids
one at a time and keeps a token only if the whole prompt so far still round-trips through the
folder's tokenizer, the lead it adds to any text (its BOS, where the model has one) included.
Prompt lengths, and so the block and window boundaries the tier crosses, are exactly those asked.

The engine's own tokenizer stays the judge: the adapter still sends a prompt only where the
engine's tokenization gives the same ids, and reports any other as "not supported" with both id
lists (a tokenizer that disagrees with the folder's is a finding, never a silent skip).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

ATTEMPTS_PER_TOKEN = 400  # candidates tried before the drawer gives up on a position


class TextStable:
    """The folder's tokenizer as a judge of which token-id prompts round-trip through text."""

    def __init__(self, model_dir: Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{model_dir} has no tokenizer.json: prompts for an engine of text prompts need one")
        self.tokenizer = Tokenizer.from_file(str(path))
        # what the tokenizer puts before any text (its BOS, where it adds one): every prompt starts with it
        self.lead: tuple[int, ...] = tuple(self.tokenizer.encode("", add_special_tokens=True).ids)

    def round_trips(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` (the lead first) is what the tokenizer makes of its own text."""
        ids = list(prompt)
        if tuple(ids[: len(self.lead)]) != self.lead:
            return False
        text = self.tokenizer.decode(ids[len(self.lead):], skip_special_tokens=False)
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids) == ids

    def draw(self, length: int, pool: Sequence[int], rng: random.Random, *, after: Sequence[int] = ()) -> tuple[int, ...]:
        """``length`` ids from ``pool`` that, following ``after`` (the lead when empty), round-trip.

        ``after`` must itself round-trip. The lead counts in ``length`` where ``after`` is empty, so
        a prompt of n tokens is n tokens as the engine sees it.
        """
        head = tuple(after) or self.lead
        if not self.round_trips(head):
            raise ValueError(f"cannot extend {list(head)[:12]}...: its own text does not give it back")
        drawn = list(head)
        end = len(after) + length if after else length
        if end < len(drawn):
            raise ValueError(f"a prompt of {length} tokens cannot hold the tokenizer's lead {list(self.lead)}")
        while len(drawn) < end:
            drawn.append(self._next_token(drawn, pool, rng))
        return tuple(drawn[len(after):])

    def _next_token(self, drawn: list[int], pool: Sequence[int], rng: random.Random) -> int:
        for _ in range(ATTEMPTS_PER_TOKEN):
            candidate = rng.choice(pool)
            if self.round_trips([*drawn, candidate]):
                return candidate
        raise ValueError(f"no token of {ATTEMPTS_PER_TOKEN} drawn keeps a prompt of {len(drawn)} tokens text-stable "
                         f"(after {drawn[-8:]}): the tokenizer merges across nearly every boundary")  # fmt: skip
