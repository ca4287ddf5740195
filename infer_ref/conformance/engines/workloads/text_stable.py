"""Prompts for an engine that takes text only: token ids whose text tokenizes back to exactly them.

An engine behind a text-only API (llama_cpp.server) tokenizes each prompt itself, so the tier can
judge a request only where the prompt's text gives its ids back. Random ids rarely do: adjacent
pieces merge (``"ab" + "c"`` becomes ``"abc"``) or split otherwise. :class:`TextStable` draws ids
one at a time and keeps a token only if the last :data:`WINDOW` tokens with it still round-trip
through the folder's tokenizer (a merge reaches only a few tokens back), then checks the whole
prompt once, the lead it adds to any text (its BOS, where the model has one) included, and redraws
from a little before the first token that does not come back. Drawing is linear in the length: an
8193-token prompt takes well under a second. Prompt lengths, and so the block and window
boundaries the tier crosses, are exactly those asked.

The engine's own tokenizer stays the judge: the adapter still sends a prompt only where the
engine's tokenization gives the same ids, and reports any other as "not supported" with both id
lists (a tokenizer that disagrees with the folder's is a finding, never a silent skip).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

ATTEMPTS_PER_TOKEN = 400  # candidates tried before the drawer gives up on a position
WINDOW = 16  # tokens before a candidate that its local check decodes with it
REDRAWS = 20  # whole-prompt checks that may each send the drawer back before it gives up


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share: what a prompt ``b`` sent after ``a`` was computed can be
    served from cache."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class TextStable:
    """The folder's tokenizer as a judge of which token-id prompts round-trip through text."""

    def __init__(self, model_dir: Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(
                f"{model_dir} has no tokenizer.json: prompts for an engine of text prompts need one"
            )
        self.tokenizer = Tokenizer.from_file(str(path))
        self.digest = hashlib.sha256(
            path.read_bytes()
        ).hexdigest()  # which tokenizer: prompts drawn for it are its own
        # what the tokenizer puts before any text (its BOS, where it adds one): every prompt starts with it
        self.lead: tuple[int, ...] = tuple(self.tokenizer.encode("", add_special_tokens=True).ids)

    def round_trips(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` (the lead first) is what the tokenizer makes of its own text."""
        return list(prompt) == self.retokenized(prompt)

    def retokenized(self, prompt: Sequence[int]) -> list[int]:
        """What the tokenizer makes of ``prompt``'s text (the lead, where ``prompt`` starts with it,
        decoded as the tokenizer adds it again): what an engine of text prompts computes when it is
        sent that text."""
        ids = list(prompt)
        body = ids[len(self.lead) :] if tuple(ids[: len(self.lead)]) == self.lead else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def as_sent(self, ids: Sequence[int]) -> tuple[int, ...] | None:
        """``ids`` as they can be sent as text: themselves where they round-trip, else what the
        tokenizer makes of their text (a chat server sends a model's answer back as text, so the
        next turn holds the answer re-tokenized) where that round-trips; None where neither does."""
        if self.round_trips(ids):
            return tuple(ids)
        again = self.retokenized(ids)
        return tuple(again) if self.round_trips(again) else None

    def draw(
        self, length: int, pool: Sequence[int], rng: random.Random, *, after: Sequence[int] = ()
    ) -> tuple[int, ...]:
        """``length`` ids from ``pool`` that, following ``after`` (the lead when empty), round-trip.

        ``after`` must itself round-trip. The lead counts in ``length`` where ``after`` is empty, so
        a prompt of n tokens is n tokens as the engine sees it.
        """
        head = tuple(after) or self.lead
        if not self.round_trips(head):
            raise ValueError(f"cannot extend {list(head)[:12]}...: its own text does not give it back")
        end = len(after) + length if after else length
        if end < len(head):
            raise ValueError(
                f"a prompt of {length} tokens cannot hold the tokenizer's lead {list(self.lead)}"
            )
        drawn = list(head)
        for _ in range(REDRAWS):
            while len(drawn) < end:
                drawn.append(self._next_token(drawn, pool, rng))
            differs = self._first_difference(drawn)
            if differs is None:
                return tuple(drawn[len(after) :])
            del drawn[max(len(head), differs - WINDOW) :]  # redraw from a little before it
        raise ValueError(
            f"no prompt of {end} tokens drawn {REDRAWS} times round-trips through text: the last "
            f"differed at position {differs} (after {drawn[-8:]})"
        )

    def _first_difference(self, ids: list[int]) -> int | None:
        """The first position where the tokenizer's ids of ``ids``' text differ from them (None: none)."""
        again = self.retokenized(ids)
        if again == ids:
            return None
        return common_prefix(ids, again)

    def _next_token(self, drawn: list[int], pool: Sequence[int], rng: random.Random) -> int:
        # The window's own text may tokenize otherwise than in context (it can start inside a word):
        # a candidate is kept where appending it leaves that tokenization as it was, itself one token after
        # it.
        window = drawn[-WINDOW:]
        before = self._local(window)
        for _ in range(ATTEMPTS_PER_TOKEN):
            candidate = rng.choice(pool)
            if self._local([*window, candidate]) == [*before, candidate]:
                return candidate
        raise ValueError(
            f"no token of {ATTEMPTS_PER_TOKEN} drawn keeps a prompt of {len(drawn)} tokens text-stable "
            f"(after {drawn[-8:]}): the tokenizer merges across nearly every boundary"
        )

    def _local(self, ids: list[int]) -> list[int]:
        """The tokenizer's ids of ``ids``' text, no lead added."""
        return list(
            self.tokenizer.encode(
                self.tokenizer.decode(ids, skip_special_tokens=False), add_special_tokens=False
            ).ids
        )
