"""The tokenizer: unreadable files named, special-token entries checked, text type checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer_ref.tokenizer import Tokenizer, TokenizerError


def _write(name: str, content: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(content, encoding="utf-8")


def _json_edit(name: str, key: str, value: Any) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        data[key] = value
        (folder / name).write_text(json.dumps(data), encoding="utf-8")

    return apply


# (id, breakage, error, words)
CASES: list[tuple[str, Callable[[Path], None], type[Exception], tuple[str, ...]]] = [
    ("tokenizer-json-not-json", _write("tokenizer.json", "{broken"), TokenizerError, ("tokenizer.json", "cannot read")),
    ("tokenizer-json-empty", _write("tokenizer.json", ""), TokenizerError, ("tokenizer.json",)),
    ("tokenizer-json-wrong-schema", _write("tokenizer.json", '{"model": 5}'), TokenizerError, ("tokenizer.json",)),
    ("tokenizer-config-not-json", _write("tokenizer_config.json", "{,"), TokenizerError, ("tokenizer_config.json",)),
    ("tokenizer-config-a-list", _write("tokenizer_config.json", "[]"), TokenizerError, ("tokenizer_config.json", "JSON object")),
    ("generation-config-not-json", _write("generation_config.json", "nope"), TokenizerError, ("generation_config.json",)),
    ("eos-unknown-token", _json_edit("tokenizer_config.json", "eos_token", "<|nope|>"), TokenizerError, ("eos_token", "'<|nope|>'")),
    ("bos-unknown-token", _json_edit("tokenizer_config.json", "bos_token", "<|nope|>"), TokenizerError, ("bos_token", "'<|nope|>'")),
    ("eos-token-a-number", _json_edit("tokenizer_config.json", "eos_token", 5), TokenizerError, ("special-token entry", "5")),
    ("eos-id-string", _json_edit("generation_config.json", "eos_token_id", "434"), TokenizerError, ("eos_token_id", "'434'")),
    ("eos-id-negative", _json_edit("generation_config.json", "eos_token_id", [-1]), TokenizerError, ("eos_token_id", "[-1]")),
    ("eos-id-bool", _json_edit("config.json", "eos_token_id", True), TokenizerError, ("eos_token_id", "True")),
    ("pad-id-float", _json_edit("generation_config.json", "pad_token_id", 1.5), TokenizerError, ("pad_token_id", "1.5")),
    ("no-tokenizer-json", lambda f: (f / "tokenizer.json").unlink(), FileNotFoundError, ("holds no tokenizer.json",)),
]


@pytest.mark.parametrize(("breakage", "error", "words"), [c[1:] for c in CASES], ids=[f"tokenizer-{c[0]}" for c in CASES])
def test_bad_tokenizer_files_are_refused_naming_the_file(
    snapshot: Path, breakage: Callable[[Path], None], error: type[Exception], words: tuple[str, ...]
) -> None:
    breakage(snapshot)
    with pytest.raises(error) as info:
        Tokenizer(snapshot)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("text", [b"bytes", 5, None, ["a"]], ids=["tokenizer-encode-bytes", "tokenizer-encode-int", "tokenizer-encode-none", "tokenizer-encode-list"])
def test_encode_refuses_non_text(snapshot: Path, text: Any) -> None:
    with pytest.raises(TypeError, match=f"text must be a str, got {type(text).__name__}"):
        Tokenizer(snapshot).encode(text)


@pytest.mark.parametrize(
    ("tokenizer", "shown"),
    [(None, "None"), ("fixtures/checkpoints/llama-tiny", "'fixtures/checkpoints/llama-tiny'"), (object, "<class 'object'>")],
    ids=["tokenizer-generate-none", "tokenizer-generate-a-path", "tokenizer-generate-no-decode"],
)
def test_generate_refuses_a_tokenizer_that_cannot_decode(llama: Any, tokenizer: Any, shown: str) -> None:
    """Refused before any work (the model never runs), naming what was passed and what is expected."""
    from infer_ref.engine import SamplingParams, generate
    from infer_ref.errors import UsageError

    model, _ = llama
    calls: list[int] = []
    with pytest.raises(UsageError) as info:
        generate(model, tokenizer, [1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=2), device="cpu",
                 on_token=calls.append)
    message = str(info.value)
    assert f"tokenizer is {shown}" in message and "decode(ids)" in message, message
    assert calls == []  # nothing was generated
