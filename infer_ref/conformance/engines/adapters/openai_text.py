"""The text dialect of the HTTP adapter: a server that takes prompts as text only (llama-cpp-python's
``llama_cpp.server``), judged only where text is exact.

A request's token ids go out as text only when the server's own tokenizer (``/extras/tokenize``)
turns that text back into exactly those ids, the BOS it adds included (:class:`PromptText`);
otherwise that request is "not supported", naming both id lists. Answers come back as token
texts, each the token's bytes decoded with invalid UTF-8 dropped (``errors="ignore"``) and
control tokens rendered empty (``detokenize(special=False)``): :class:`RenderedTokens` maps a text
to an id only where exactly one token of the folder can render to it. It reads the other
renderings engines use as well: a control token by its name, a token as its raw bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

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

    def __init__(
        self,
        model_dir: Path,
        engine_tokenize: Callable[[str], Sequence[int] | None],
        *,
        engine: str = "the engine",
        lead: Sequence[int] | None = None,
    ) -> None:
        self.tokens = TokenTable(Path(model_dir))
        self.engine_tokenize = engine_tokenize
        self.engine = engine
        self.lead = tuple(lead) if lead is not None else tuple(engine_tokenize("") or ())

    def to_text(self, prompt: Sequence[int]) -> str:
        """The text whose tokenization by the engine is exactly ``prompt`` (else ``Unsupported``)."""
        ids = list(prompt)
        body = ids[len(self.lead) :] if tuple(ids[: len(self.lead)]) == self.lead else ids
        text = self.tokens.decode(body)
        found = self.engine_tokenize(text)
        theirs = None if found is None else list(found)
        if theirs != ids:
            raise Unsupported(
                f"{self.engine} takes prompts as text only, and this prompt's text does not "
                f"tokenize back to its ids: the request's {ids} became {theirs} "
                f"(text {text[:60]!r}); only prompts whose text round-trips are judged"
            )
        return text


class RenderedTokens(TokenTable):
    """Token texts as engines render them, back to ids only where no other token renders the same.

    Three renderings are read, each exactly:

    * a token's **text** as a detokenizer writes it (llama-cpp-python's ``detokenize(special=False)``,
      transformers' ``skip_special_tokens=True``): bytes that are not valid UTF-8 dropped (the
      folder's decoder writes U+FFFD there: removed, that text is claimed by several tokens), a
      control token empty (so ``""`` is never one token);
    * a control token by its **name** (``"<end_of_turn>"``: ``skip_special_tokens=False``, llama.cpp's
      ``special=True``), where no ordinary token renders to the same text;
    * a token as its raw **bytes** (a ``bytes`` object: OpenAI-style ``logprobs.content[].bytes``,
      llama.cpp's ``token_to_piece``): an ordinary token's bytes, a control token's name in UTF-8.

    A text (or bytes) several tokens may render to, or none, makes the request "not supported".
    """

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self._rendered: dict[str, int | None] | None = None
        self._by_bytes: dict[bytes, int | None] | None = None

    def to_id(self, token: str | bytes) -> int:
        if isinstance(token, bytes):
            found = self._bytes_table().get(token, -1)
        elif token.startswith(ID_PREFIX):
            return super().to_id(token)
        else:
            found = self._renderings().get(token, -1)
        if found is None or found == -1:
            how = "several of" if found is None else "none of"
            what = "bytes" if isinstance(token, bytes) else "token text"
            raise Unsupported(
                f"the engine answered the {what} {token!r}, which {how} {self.model_dir}'s "
                "tokens render to: its id is not known exactly"
            )
        return found

    def _renderings(self) -> dict[str, int | None]:
        if self._rendered is None:
            table: dict[str, int | None] = {"": None}  # control tokens, and bytes that are all invalid
            special = set(self.special_ids())
            for text, token_id in self._decoded().items():
                if token_id is None or REPLACEMENT in text:
                    table[text.replace(REPLACEMENT, "")] = None
                elif token_id not in special:
                    table[text] = None if text in table else token_id
            for token_id in special:  # by name, unless an ordinary token renders to the same text
                name = self.decode([token_id])
                table[name] = None if name in table else token_id
            self._rendered = table
        return self._rendered

    def _bytes_table(self) -> dict[bytes, int | None]:
        if self._by_bytes is None:
            table: dict[bytes, int | None] = {}
            for token_id, piece in token_pieces(self._tokenizer(), self.vocab_size).items():
                table[piece] = None if piece in table else token_id
            self._by_bytes = table
        return self._by_bytes


def token_pieces(tokenizer: Tokenizer, vocab_size: int) -> dict[int, bytes]:
    """Each token's raw bytes: an added token's (BOS, EOS, chat markers) its name in UTF-8; a
    byte-level BPE token's (Llama 3, Qwen 3) its characters mapped back through the byte alphabet;
    a SentencePiece-style one's (``<0x0A>`` a byte, ``▁`` a space) otherwise."""
    added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    byte_level = "ByteLevel" in json.dumps(json.loads(tokenizer.to_str()).get("decoder"))
    alphabet = {c: b for b, c in _byte_alphabet().items()}
    pieces = {}
    for token_id in range(min(vocab_size, tokenizer.get_vocab_size())):
        token = tokenizer.id_to_token(token_id)
        if token is None:
            continue
        if token_id in added:
            pieces[token_id] = added[token_id].encode()
        elif byte_level and all(c in alphabet for c in token):
            pieces[token_id] = bytes(alphabet[c] for c in token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            pieces[token_id] = bytes([int(token[3:5], 16)])
        else:
            pieces[token_id] = token.replace("\u2581", " ").encode()
    return pieces


def _byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for
    themselves, the other 68 for the characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    stand_ins = iter(range(0x100, 0x100 + 256))
    return {b: chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)}
