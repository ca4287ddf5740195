"""A thin wrapper over a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).

Special-token metadata is read the way a Hugging Face snapshot stores it:

- ``bos_token_id``: ``tokenizer_config.json`` ``bos_token`` when that key is present (``null`` means
  no BOS, as in Qwen3), else ``bos_token_id`` from ``generation_config.json`` / ``config.json``.
- ``eos_token_ids``: the union, in this order, of ``generation_config.json`` ``eos_token_id``
  (int or list), ``config.json`` ``eos_token_id`` (int or list) and ``tokenizer_config.json``
  ``eos_token``.
- ``pad_token_id``: ``tokenizer_config.json`` ``pad_token``, else ``pad_token_id`` from
  ``generation_config.json`` / ``config.json``, else ``None``.

Chat prompts rendered by :func:`infer_ref.chat.render_chat_template` already begin with the BOS
string for Llama and Gemma; :meth:`Tokenizer.encode` never adds a second BOS to such text.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from infer_ref.config import read_json_object
from infer_ref.errors import DataError
from infer_ref.paths import resolve_model_path
from infer_ref.validation import TokenIdError, check_token_id, check_token_ids

__all__ = ["Tokenizer", "TokenizerError"]


class TokenizerError(DataError):
    """A tokenizer file or special-token entry that cannot be used (a ``ValueError``; CLI exit status 3)."""

_SIDE_FILES = ("tokenizer_config.json", "generation_config.json", "config.json")


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return read_json_object(path, TokenizerError)


def _token_content(value: Any) -> str | None:
    """``tokenizer_config.json`` stores tokens as strings or as AddedToken dicts."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"unrecognised special-token entry in tokenizer_config.json: {value!r}")


def _as_id_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if isinstance(value, bool):
        raise TokenizerError(f"{name} must be an int, got {value!r}")
    if isinstance(value, int) and value >= 0:
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    raise TokenizerError(f"{name} must be a token id (int >= 0) or a list of them, got {value!r}")


class Tokenizer:
    """Encode/decode text with a local ``tokenizer.json``.

    Args:
        path: a local snapshot folder (holding ``tokenizer.json`` and optionally
            ``tokenizer_config.json``, ``generation_config.json``, ``config.json``), a
            ``tokenizer.json`` file, or a name resolved by
            :func:`infer_ref.paths.resolve_model_path` (``$INFER_REF_MODELS/<name>``).

    Raises:
        FileNotFoundError: the path does not exist (nothing is ever downloaded), or the folder
            holds no ``tokenizer.json``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        resolved = resolve_model_path(path)
        if resolved.is_dir():
            folder = resolved
            tok_file = resolved / "tokenizer.json"
            if not tok_file.is_file():
                raise FileNotFoundError(
                    f"{resolved} holds no tokenizer.json; infer_ref reads only the fast-tokenizer "
                    "file of a Hugging Face snapshot"
                )
        else:
            folder = resolved.parent
            tok_file = resolved
        self.path: pathlib.Path = resolved
        try:
            self._tok: _HFTokenizer = _HFTokenizer.from_file(str(tok_file))
        except Exception as err:  # the tokenizers library raises a bare Exception for every parse error
            raise TokenizerError(f"cannot read {tok_file}: {err} (expected a Hugging Face tokenizer.json)") from None

        tok_cfg = _read_json(folder / _SIDE_FILES[0])
        gen_cfg = _read_json(folder / _SIDE_FILES[1])
        model_cfg = _read_json(folder / _SIDE_FILES[2])

        added = self._tok.get_added_tokens_decoder()
        self._special_tokens: dict[str, int] = {
            tok.content: idx for idx, tok in sorted(added.items()) if tok.special
        }

        # BOS: tokenizer_config wins when it has the key at all (null = no BOS).
        if "bos_token" in tok_cfg:
            bos = _token_content(tok_cfg["bos_token"])
            self.bos_token_id: int | None = None if bos is None else self._require_id(bos, "bos_token")
        else:
            ids = _as_id_list(gen_cfg.get("bos_token_id", model_cfg.get("bos_token_id")), "bos_token_id")
            self.bos_token_id = ids[0] if ids else None

        eos: list[int] = []
        eos += _as_id_list(gen_cfg.get("eos_token_id"), "generation_config.json eos_token_id")
        eos += _as_id_list(model_cfg.get("eos_token_id"), "config.json eos_token_id")
        eos_str = _token_content(tok_cfg.get("eos_token"))
        if eos_str is not None:
            eos.append(self._require_id(eos_str, "eos_token"))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))

        pad_str = _token_content(tok_cfg.get("pad_token"))
        if pad_str is not None:
            self.pad_token_id: int | None = self._require_id(pad_str, "pad_token")
        else:
            ids = _as_id_list(gen_cfg.get("pad_token_id", model_cfg.get("pad_token_id")), "pad_token_id")
            self.pad_token_id = ids[0] if ids else None

        # The family the snapshot's config.json names (None for a bare tokenizer.json): generate
        # refuses a tokenizer of another family than the model's.
        model_type = model_cfg.get("model_type")
        self.model_type: str | None = "gemma3_text" if model_type == "gemma3" else model_type

        self.bos_token: str | None = (
            None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)
        )

    def _require_id(self, token: str, what: str) -> int:
        idx = self._tok.token_to_id(token)
        if idx is None:
            raise TokenizerError(f"{what} {token!r} from tokenizer_config.json is not in the vocabulary")
        return int(idx)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the largest id + 1 for contiguous vocabularies)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def special_tokens(self) -> dict[str, int]:
        """Added tokens marked ``special`` in ``tokenizer.json``, token string -> id."""
        return dict(self._special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` (a vocabulary entry or added token), or ``None``."""
        idx = self._tok.token_to_id(token)
        return None if idx is None else int(idx)

    def id_to_token(self, idx: int) -> str | None:
        """Vocabulary entry for ``idx``, or ``None`` past the vocabulary; a negative or non-integer id is refused."""
        check_token_id(idx, name="idx")
        if idx >= 2**32:  # past any vocabulary (the tokenizer's ids are u32): None, not its OverflowError
            return None
        tok = self._tok.id_to_token(idx)
        return None if tok is None else str(tok)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        With ``add_special_tokens=True`` the tokenizer's post-processor runs (Llama and Gemma add
        BOS, Qwen3 adds nothing) — except that a BOS is never doubled: when ``text`` already begins
        with the BOS string (a rendered chat prompt), the added one is dropped.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [int(i) for i in self._tok.encode(text, add_special_tokens=add_special_tokens).ids]
        bos = self.bos_token_id
        if (
            add_special_tokens
            and bos is not None
            and self.bos_token is not None
            and text.startswith(self.bos_token)
            and ids[:2] == [bos, bos]
        ):
            del ids[0]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (integers in ``[0, vocab_size)``); special tokens are dropped unless ``skip_special_tokens=False``."""
        if not isinstance(ids, Iterable) or isinstance(ids, (str, bytes)):  # decode(5) means decode([5])? never guessed
            raise TokenIdError(f"ids must be a sequence of integer token ids, got {ids!r} ({type(ids).__name__})")
        ids = list(ids)
        check_token_ids(ids, self.vocab_size, name="ids")  # out-of-range ids would decode to nothing, silently
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
            f"eos_token_ids={self.eos_token_ids})"
        )
