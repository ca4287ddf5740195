"""llama.cpp's converter as the adapter runs it, without llama.cpp: the pre-tokenizer named from the
tokenizer's regex, the wrapper that names it only where the converter refuses, the cache, and one
clear error for each thing a user can get wrong (no source tree, a converter that fails, no engine)."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.engine_venv import worker_env
from infer_ref.conformance.engines.adapters.llamacpp import start_llamacpp
from infer_ref.conformance.engines.adapters.llamacpp_gguf import (
    SOURCE_ENV,
    LlamaCppSourceMissing,
    convert,
    llamacpp_source,
    pre_tokenizer_for,
)
from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"

# A stand-in converter tree: convert_hf_to_gguf.py asks conversion.base.TextModel for the
# pre-tokenizer (refusing as llama.cpp's does unless RECOGNISE names one) and writes it to --outfile.
FAKE_BASE = '''
import os


class TextModel:
    def get_vocab_base_pre(self, tokenizer):
        if os.environ.get("RECOGNISE"):
            return os.environ["RECOGNISE"]
        raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")
'''
FAKE_CONVERTER = '''
import argparse, os, sys
from conversion.base import TextModel

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--outtype")
parser.add_argument("--outfile")
args = parser.parse_args()
if os.environ.get("FAIL"):
    sys.exit("ValueError: " + os.environ["FAIL"])
with open(args.outfile, "w") as out:
    out.write(TextModel().get_vocab_base_pre(None) + " " + args.outtype)
'''


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "llama.cpp"
    (tree / "conversion").mkdir(parents=True)
    (tree / "conversion" / "__init__.py").write_text("")
    (tree / "conversion" / "base.py").write_text(textwrap.dedent(FAKE_BASE))
    (tree / "convert_hf_to_gguf.py").write_text(textwrap.dedent(FAKE_CONVERTER))
    return tree


def _convert(model_dir: Path, tree: Path, cache: Path, dtype: str = "float32", **env: str):  # type: ignore[no-untyped-def]
    return convert(model_dir, dtype, python=sys.executable, source=tree, env={**worker_env(), **env}, cache=cache)


@pytest.mark.parametrize(("family", "expected"), [("llama-tiny", "llama-bpe"), ("qwen3-tiny", "qwen2"), ("gemma3-tiny", "qwen2")])
def test_pre_tokenizer_is_the_one_whose_regex_the_tokenizer_splits_with(family: str, expected: str) -> None:
    # llama-tiny splits digits in groups of up to three (\p{N}{1,3}), Llama 3's regex; the other two
    # one digit at a time (\p{N}), Qwen 2's: llama.cpp's src/llama-vocab.cpp quotes both regexes.
    spec = json.loads((FIXTURES / family / "tokenizer.json").read_text())
    regex = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    assert ("\\p{N}{1,3}" in regex) == (expected == "llama-bpe")
    assert pre_tokenizer_for(FIXTURES / family) == expected


def test_a_tokenizer_with_an_unknown_regex_is_not_supported(tmp_path: Path) -> None:
    spec = json.loads((FIXTURES / "qwen3-tiny" / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(Unsupported, match="no pre-tokenizer known to split with"):
        pre_tokenizer_for(tmp_path)


def test_no_tokenizer_json_names_no_pre_tokenizer(tmp_path: Path) -> None:
    assert pre_tokenizer_for(tmp_path) is None


def test_a_missing_source_tree_is_one_error_naming_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    with pytest.raises(LlamaCppSourceMissing, match=SOURCE_ENV) as info:
        llamacpp_source(None, str(tmp_path / "venv" / "bin" / "python"))
    assert "\n" not in str(info.value)
    with pytest.raises(LlamaCppSourceMissing, match="no llama.cpp converter at"):
        llamacpp_source(tmp_path, sys.executable)


def test_the_tree_in_the_engine_venv_is_found_without_the_variable(fake_tree: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    venv = tmp_path / "venv"
    (venv / "src").mkdir(parents=True)
    shutil.copytree(fake_tree, venv / "src" / "llama.cpp")
    assert llamacpp_source(None, str(venv / "bin" / "python")) == venv / "src" / "llama.cpp"


def test_the_pre_tokenizer_is_named_only_where_the_converter_refuses(fake_tree: Path, tmp_path: Path) -> None:
    named = _convert(FIXTURES / "llama-tiny", fake_tree, tmp_path / "a")
    assert named.path.read_text() == "llama-bpe f32"
    recognised = _convert(FIXTURES / "llama-tiny", fake_tree, tmp_path / "b", RECOGNISE="its-own")
    assert recognised.path.read_text() == "its-own f32"


def test_a_conversion_is_cached_by_content_and_outtype(fake_tree: Path, tmp_path: Path) -> None:
    first = _convert(FIXTURES / "qwen3-tiny", fake_tree, tmp_path)
    again = _convert(FIXTURES / "qwen3-tiny", fake_tree, tmp_path, FAIL="would fail if run")
    assert again.path == first.path and again.seconds == 0.0
    half = _convert(FIXTURES / "qwen3-tiny", fake_tree, tmp_path, dtype="float16")
    assert half.path != first.path and half.path.read_text() == "qwen2 f16"
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURES / "qwen3-tiny", copy)
    assert _digest(_convert(copy, fake_tree, tmp_path / "c").path) == _digest(first.path)  # same content
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    assert _digest(_convert(copy, fake_tree, tmp_path / "d").path) != _digest(first.path)


def _digest(gguf: Path) -> str:
    return gguf.name.split("-")[-2]  # NAME-DIGEST-OUTTYPE.gguf


def test_a_failing_converter_is_one_line_and_caches_nothing(fake_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="converter exited with status 1 .*ValueError: no such tensor") as info:
        _convert(FIXTURES / "qwen3-tiny", fake_tree, tmp_path, FAIL="no such tensor")
    assert "\n" not in str(info.value)
    assert not list(tmp_path.glob("*.gguf"))


def test_float64_has_no_gguf_type(fake_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="writes no float64 weights"):
        _convert(FIXTURES / "qwen3-tiny", fake_tree, tmp_path, dtype="float64")


def test_an_interpreter_without_llama_cpp_is_one_error_naming_the_variable(fake_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineNotInstalled, match="INFER_REF_LLAMACPP_PYTHON") as info:
        start_llamacpp(FIXTURES / "qwen3-tiny", EngineOptions(), python=sys.executable, source=fake_tree, cache=tmp_path)
    assert "\n" not in str(info.value)
