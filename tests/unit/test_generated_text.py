"""Generated ids the tokenizer has no text for (a padded model vocabulary) add no text and stay in the ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer_ref.results import generated_text
from infer_ref.tokenizer import Tokenizer
from infer_ref.validation import TokenIdError

QWEN = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "qwen3-tiny"


def test_an_id_past_the_tokenizer_adds_no_text() -> None:
    tok = Tokenizer(QWEN / "tokenizer.json")
    model_vocab = json.loads((QWEN / "config.json").read_text())["vocab_size"]
    padded = model_vocab - 1
    assert padded >= tok.vocab_size  # qwen3-tiny's embedding table is padded past its tokenizer (448 > 397)
    with pytest.raises(TokenIdError):  # from a caller, such an id is a mistake
        tok.decode([5, padded])
    assert generated_text(tok, [5, padded, 6]) == tok.decode([5, 6])
    assert generated_text(tok, [padded]) == ""


def test_the_first_id_past_the_tokenizer_adds_no_text() -> None:
    tok = Tokenizer(QWEN / "tokenizer.json")  # ids 0 .. vocab_size - 1 have text
    assert generated_text(tok, [5, tok.vocab_size, 6]) == tok.decode([5, 6])
    assert generated_text(tok, [tok.vocab_size - 1]) == tok.decode([tok.vocab_size - 1], skip_special_tokens=True)
