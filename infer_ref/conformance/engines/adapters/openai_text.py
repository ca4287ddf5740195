"""The text dialect of the HTTP adapter: a server that takes prompts as text only (llama-cpp-python's
``llama_cpp.server``), judged only where text is exact.

A request's token ids go out as text only when the server's own tokenizer (``/extras/tokenize``)
turns that text back into exactly those ids, the BOS it adds included (:class:`PromptText`);
otherwise that request is "not supported", naming both id lists. Answers come back as token
texts, each the token's bytes decoded with invalid UTF-8 dropped (``errors="ignore"``) and
control tokens rendered empty (``detokenize(special=False)``): :class:`RenderedTokens` maps a text
to an id only where exactly one token of the folder can render to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from infer_ref.conformance.engines.adapters.openai_client import HttpClient, ServerRefused
from infer_ref.conformance.engines.adapters.openai_tokens import ID_PREFIX, TokenTable
from infer_ref.conformance.interface.contract import Unsupported

TOKENIZE_PATH = "/extras/tokenize"
REPLACEMENT = "\ufffd"  # what a byte-level decoder writes for bytes that are no valid UTF-8


def server_tokenize(client: HttpClient, model: str, text: str) -> list[int] | None:
    """The server's tokenization of ``text`` as its completion path does it (BOS included), or None
    where it offers no ``/extras/tokenize``."""
    try:
        answer = client.post(TOKENIZE_PATH, {"model": model, "input": text}, root=True)
    except ServerRefused:
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return [int(t) for t in tokens] if isinstance(tokens, list) else None


class PromptText:
    """Token-id prompts as text, for an engine whose tokenizer is ``engine_tokenize(text) -> ids``
    (None where it cannot say). ``lead``: what it puts before any text (default: its tokenization of
    the empty text); a prompt that starts with it is decoded without it."""

    def __init__(self, model_dir: Path, engine_tokenize: Callable[[str], Sequence[int] | None], *,
                 engine: str = "the engine", lead: Sequence[int] | None = None) -> None:  # fmt: skip
        self.tokens = TokenTable(Path(model_dir))
        self.engine_tokenize = engine_tokenize
        self.engine = engine
        self.lead = tuple(lead) if lead is not None else tuple(engine_tokenize("") or ())

    def to_text(self, prompt: Sequence[int]) -> str:
        """The text whose tokenization by the engine is exactly ``prompt`` (else ``Unsupported``)."""
        ids = list(prompt)
        body = ids[len(self.lead):] if tuple(ids[: len(self.lead)]) == self.lead else ids
        text = self.tokens.decode(body)
        found = self.engine_tokenize(text)
        theirs = None if found is None else list(found)
        if theirs != ids:
            raise Unsupported(f"{self.engine} takes prompts as text only, and this prompt's text does not "
                              f"tokenize back to its ids: the request's {ids} became {theirs} "
                              f"(text {text[:60]!r}); only prompts whose text round-trips are judged")  # fmt: skip
        return text


class RenderedTokens(TokenTable):
    """Token texts as llama-cpp-python renders them, back to ids only where no other token renders the same.

    A token whose bytes are not valid UTF-8 renders without them (the folder's decoder writes
    U+FFFD there: removed, that text is claimed by several tokens); a control token renders
    empty. A text several tokens may render to, or none, makes the request "not supported".
    """

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self._rendered: dict[str, int | None] | None = None

    def to_id(self, token: str) -> int:
        if token.startswith(ID_PREFIX):
            return super().to_id(token)
        found = self._renderings().get(token, -1)
        if found is None or found == -1:
            how = "several of" if found is None else "none of"
            raise Unsupported(f"the engine answered the token text {token!r}, which {how} {self.model_dir}'s "
                              "tokens render to: its id is not known exactly")  # fmt: skip
        return found

    def _renderings(self) -> dict[str, int | None]:
        if self._rendered is None:
            table: dict[str, int | None] = {"": None}  # control tokens, and bytes that are all invalid
            for text, token_id in self._decoded().items():
                if token_id is None or REPLACEMENT in text:
                    table[text.replace(REPLACEMENT, "")] = None
                else:
                    table[text] = None if text in table else token_id
            for token_id in self.special_ids():
                table[self.decode([token_id])] = None
            self._rendered = table
        return self._rendered
