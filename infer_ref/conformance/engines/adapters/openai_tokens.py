"""Token strings of an OpenAI-style answer back to token ids, and a position's top-k put in rank order.

vLLM can answer tokens as ``token_id:N`` (``return_tokens_as_token_ids``); other servers answer
each token's decoded text, which only the folder's tokenizer can map back, and only where no
other token decodes to the same text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from infer_ref.conformance.engines.adapters.openai_client import EndpointError

ID_PREFIX = "token_id:"


class TokenTable:
    """The folder's vocabulary: its size (config.json) and, lazily, decoded text -> token id."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.vocab_size = _vocab_size(model_dir)
        self._by_text: dict[str, int | None] | None = None  # None value: several ids decode to it
        self._loaded: Tokenizer | None = None

    def to_id(self, token: str) -> int:
        if token.startswith(ID_PREFIX):
            token_id = int(token[len(ID_PREFIX) :])
        else:
            found = self._decoded().get(token, -1)
            if found == -1:
                raise EndpointError(
                    f"the server answered the token text {token!r}, which no token of "
                    f"{self.model_dir} decodes to: it serves another model"
                )
            if found is None:
                raise EndpointError(
                    f"the server answered the token text {token!r}, which several of "
                    f"{self.model_dir}'s tokens decode to: it must answer token ids "
                    "(vLLM does with return_tokens_as_token_ids)"
                )
            token_id = found
        if not 0 <= token_id < self.vocab_size:
            raise EndpointError(
                f"the server answered a token ({token!r}) outside {self.model_dir}'s vocabulary "
                f"of {self.vocab_size}: it serves another model"
            )
        return token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The folder's text of ``ids``, special tokens written out."""
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=False))

    def special_ids(self) -> list[int]:
        """The tokenizer's added tokens marked special (BOS, EOS, chat markers)."""
        return sorted(i for i, added in self._tokenizer().get_added_tokens_decoder().items() if added.special)

    def _decoded(self) -> dict[str, int | None]:
        if self._by_text is None:
            tokenizer = self._tokenizer()
            table: dict[str, int | None] = {}
            for token_id in range(min(self.vocab_size, tokenizer.get_vocab_size())):
                text = tokenizer.decode([token_id], skip_special_tokens=False)
                table[text] = None if text in table else token_id
            self._by_text = table
        return self._by_text

    def _tokenizer(self) -> Tokenizer:
        if self._loaded is None:
            path = self.model_dir / "tokenizer.json"
            if not path.is_file():
                raise EndpointError(
                    f"{self.model_dir} has no tokenizer.json to read the server's token texts with"
                )
            self._loaded = Tokenizer.from_file(str(path))
        return self._loaded


def _vocab_size(model_dir: Path) -> int:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise EndpointError(
            f"{model_dir}/config.json cannot be read ({err}): pass the folder the server serves"
        ) from None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise EndpointError(f"{model_dir}/config.json names no vocab_size")
    return size


def order_top(
    chosen: int, entries: Sequence[tuple[int, float]], asked: int, k: int
) -> tuple[tuple[int, float], ...]:
    """The first ``k`` of a position's top-``asked``, from an answer that lists the chosen token first.

    OpenAI-style answers (vLLM's among them) put the chosen token first, then the top-``asked``
    by rank, adding the chosen one beyond them when it is not one of them (``asked + 1``
    entries). The others keep the server's order; the chosen one, when it belongs, goes before the
    first entry with a smaller logprob.
    """
    others = [(t, lp) for t, lp in entries if t != chosen]
    if len(entries) > asked:  # the chosen token came on top of the top-k
        return tuple(others[:k])
    chosen_logprob = dict(entries)[chosen]
    at = next((i for i, (_, lp) in enumerate(others) if lp < chosen_logprob), len(others))
    return tuple([*others[:at], (chosen, chosen_logprob), *others[at:]][:k])
