"""Tokenizer on the fixture tokenizers (fixtures/checkpoints/*-tiny), plus path resolution.

Oracles: the family's special-token lists as the real Llama 3.2 / Qwen3 / Gemma 3 snapshots define
them, the raw ``tokenizer.json`` contents, and transformers' own tokenizer on the same files.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from infer_ref.chat import render_chat_template
from infer_ref.paths import resolve_model_path
from infer_ref.tokenizer import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
CKPT = ROOT / "fixtures" / "checkpoints"
FAMILIES = ["llama", "qwen3", "gemma3"]
MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3_text"}

# The real special tokens of each family; the ones in SPECIAL are marked special in tokenizer.json.
SPECIAL = {
    "llama": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
    ],
    "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "gemma3": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
}
# Qwen3 ships <think> and </think> as added tokens with special=false.
ADDED_NOT_SPECIAL = {"llama": [], "qwen3": ["<think>", "</think>"], "gemma3": []}
BOS = {"llama": "<|begin_of_text|>", "qwen3": None, "gemma3": "<bos>"}
# generation_config.json eos list first, then config.json, then tokenizer_config.json eos_token.
EOS = {
    "llama": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    "qwen3": ["<|im_end|>", "<|endoftext|>"],
    "gemma3": ["<eos>", "<end_of_turn>"],
}
PAD = {"llama": None, "qwen3": "<|endoftext|>", "gemma3": "<pad>"}

TEXTS = [
    "",
    "Count to ten.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "What is 2 + 3? 2 + 3 = 5.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines\n\n",
    "Grüße aus Köln — 東京 🙂 ñ",
    "an unknown word: Zyzzyva",
]


def _all_specials(family: str) -> list[str]:
    return SPECIAL[family] + ADDED_NOT_SPECIAL[family]


_CACHE: dict[str, Tokenizer] = {}


def _cached(family: str) -> Tokenizer:
    if family not in _CACHE:
        _CACHE[family] = Tokenizer(CKPT / f"{family}-tiny")
    return _CACHE[family]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def tok(family: str) -> Tokenizer:
    return _cached(family)


def test_round_trip_fixed_texts(tok: Tokenizer) -> None:
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(isinstance(i, int) for i in ids)
        assert tok.decode(ids) == text, (text, ids)


@pytest.mark.parametrize("family_name", FAMILIES)
@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40))
def test_round_trip_any_text(family_name: str, text: str) -> None:
    tok = _cached(family_name)
    assume(not any(s in text for s in _all_specials(family_name)))
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_special_tokens_encode_to_single_ids(tok: Tokenizer, family: str) -> None:
    for s in _all_specials(family):
        idx = tok.token_to_id(s)
        assert idx is not None, s
        assert tok.encode(s, add_special_tokens=False) == [idx]
        assert tok.id_to_token(idx) == s
        assert tok.encode(f"a{s}b", add_special_tokens=False)[1] == idx
    assert set(tok.special_tokens) >= set(SPECIAL[family])
    assert not set(tok.special_tokens) & set(ADDED_NOT_SPECIAL[family])
    assert tok.special_tokens == {s: tok.token_to_id(s) for s in tok.special_tokens}


def test_decode_skips_special_tokens_unless_asked(tok: Tokenizer, family: str) -> None:
    eot = {"llama": "<|eot_id|>", "qwen3": "<|im_end|>", "gemma3": "<end_of_turn>"}[family]
    ids = tok.encode(f"Hi.{eot}", add_special_tokens=False)
    assert tok.decode(ids) == "Hi."
    assert tok.decode(ids, skip_special_tokens=False) == f"Hi.{eot}"


def test_qwen3_think_tokens_are_not_skipped() -> None:
    tok = _cached("qwen3")
    ids = tok.encode("<think>\n\n</think>\n\nHi", add_special_tokens=False)
    assert tok.decode(ids) == "<think>\n\n</think>\n\nHi"


def test_bos_eos_pad_ids(tok: Tokenizer, family: str) -> None:
    bos = BOS[family]
    assert tok.bos_token_id == (None if bos is None else tok.token_to_id(bos))
    assert tok.bos_token == bos
    assert tok.eos_token_ids == tuple(tok.token_to_id(s) for s in EOS[family])
    pad = PAD[family]
    assert tok.pad_token_id == (None if pad is None else tok.token_to_id(pad))


def test_add_special_tokens_adds_bos_only_for_llama_and_gemma(tok: Tokenizer, family: str) -> None:
    plain = tok.encode("Count to ten.", add_special_tokens=False)
    with_special = tok.encode("Count to ten.")
    if BOS[family] is None:
        assert with_special == plain
    else:
        assert with_special == [tok.token_to_id(BOS[family]), *plain]


def test_rendered_prompt_never_gets_a_second_bos(tok: Tokenizer, family: str) -> None:
    import tokenizers

    prompt = render_chat_template([{"role": "user", "content": "Count to ten."}], MODEL_TYPE[family])
    ids = tok.encode(prompt)
    assert ids == tok.encode(prompt, add_special_tokens=False)
    bos = BOS[family]
    if bos is not None:
        bos_id = tok.token_to_id(bos)
        assert prompt.startswith(bos)
        assert ids[0] == bos_id
        assert ids.count(bos_id) == 1
        # The raw post-processor does double it; the wrapper is what prevents that.
        raw = tokenizers.Tokenizer.from_file(str(CKPT / f"{family}-tiny" / "tokenizer.json"))
        assert raw.encode(prompt).ids[:2] == [bos_id, bos_id]


def test_bos_string_later_in_text_is_kept(tok: Tokenizer, family: str) -> None:
    bos = BOS[family]
    if bos is None:
        pytest.skip("Qwen3 has no BOS")
    bos_id = tok.token_to_id(bos)
    ids = tok.encode(f"Hi{bos}")
    assert ids[0] == bos_id and ids[-1] == bos_id and ids.count(bos_id) == 2


def test_vocab_size_and_lookups_match_tokenizer_json(tok: Tokenizer, family: str) -> None:
    data = json.loads((CKPT / f"{family}-tiny" / "tokenizer.json").read_text(encoding="utf-8"))
    ids = set(data["model"]["vocab"].values()) | {t["id"] for t in data["added_tokens"]}
    assert tok.vocab_size == len(ids) == max(ids) + 1
    for token, idx in list(data["model"]["vocab"].items())[:50]:
        assert tok.token_to_id(token) == idx
        assert tok.id_to_token(idx) == token
    assert tok.token_to_id("no such token in this vocabulary") is None
    assert tok.id_to_token(tok.vocab_size + 10) is None


def test_agrees_with_transformers_tokenizer(tok: Tokenizer, family: str) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(CKPT / f"{family}-tiny"))
    prompt = render_chat_template([{"role": "user", "content": "What is 2 + 3?"}], MODEL_TYPE[family])
    for text in [*TEXTS, prompt]:
        expected = ref(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text, add_special_tokens=False) == expected
        assert tok.decode(expected) == ref.decode(expected, skip_special_tokens=True)
    assert tok.encode("Count to ten.") == ref("Count to ten.")["input_ids"]
    assert tok.bos_token_id == ref.bos_token_id


def test_accepts_tokenizer_json_file(family: str) -> None:
    folder = CKPT / f"{family}-tiny"
    by_file = Tokenizer(folder / "tokenizer.json")
    by_dir = _cached(family)
    assert by_file.encode("Count to ten.") == by_dir.encode("Count to ten.")
    assert by_file.eos_token_ids == by_dir.eos_token_ids


# ------------------------------------------------------------------ metadata from snapshot files


def _snapshot(tmp_path: pathlib.Path, family: str, **side: object) -> pathlib.Path:
    """A folder with the family's tokenizer.json and the given side files (name -> JSON object)."""
    d = tmp_path / "snap"
    d.mkdir()
    shutil.copy(CKPT / f"{family}-tiny" / "tokenizer.json", d / "tokenizer.json")
    for name, obj in side.items():
        (d / f"{name}.json").write_text(json.dumps(obj), encoding="utf-8")
    return d


def test_eos_union_of_all_three_sources(tmp_path: pathlib.Path) -> None:
    raw = Tokenizer(CKPT / "llama-tiny" / "tokenizer.json")
    eot, eom, end = (raw.token_to_id(s) for s in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"))
    d = _snapshot(
        tmp_path,
        "llama",
        generation_config={"eos_token_id": eom},
        config={"eos_token_id": [end, eom]},
        tokenizer_config={"eos_token": {"content": "<|eot_id|>", "special": True}, "bos_token": None},
    )
    tok = Tokenizer(d)
    assert tok.eos_token_ids == (eom, end, eot)
    assert tok.bos_token_id is None


def test_bos_and_pad_fall_back_to_model_configs(tmp_path: pathlib.Path) -> None:
    raw = Tokenizer(CKPT / "gemma3-tiny" / "tokenizer.json")
    d = _snapshot(tmp_path, "gemma3", config={"bos_token_id": 2, "pad_token_id": 0, "eos_token_id": 1})
    tok = Tokenizer(d)
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_ids) == (2, 0, (1,))
    assert raw.token_to_id("<bos>") == 2 and raw.token_to_id("<pad>") == 0


def test_no_side_files_means_no_metadata(tmp_path: pathlib.Path) -> None:
    tok = Tokenizer(_snapshot(tmp_path, "qwen3"))
    assert (tok.bos_token_id, tok.eos_token_ids, tok.pad_token_id) == (None, (), None)


def test_unknown_special_token_in_tokenizer_config(tmp_path: pathlib.Path) -> None:
    d = _snapshot(tmp_path, "qwen3", tokenizer_config={"eos_token": "<|not_in_vocab|>"})
    with pytest.raises(ValueError, match=r"eos_token '<\|not_in_vocab\|>'.*not in the vocabulary"):
        Tokenizer(d)


# ---------------------------------------------------------------------------------- path lookup


def test_hub_id_without_models_dir_raises_helpful_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFER_REF_MODELS", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        Tokenizer("meta-llama/Llama-3.2-1B")
    msg = str(err.value)
    assert "'meta-llama/Llama-3.2-1B'" in msg
    assert "never downloads" in msg
    assert "local snapshot folder" in msg
    assert "INFER_REF_MODELS" in msg


def test_models_dir_resolves_full_name_and_last_component(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    short = models / "Llama-3.2-1B-Instruct"
    full = models / "org" / "Qwen3-1.7B"
    shutil.copytree(CKPT / "llama-tiny", short)
    shutil.copytree(CKPT / "qwen3-tiny", full)
    monkeypatch.setenv("INFER_REF_MODELS", str(models))
    monkeypatch.chdir(tmp_path)  # relative names must not resolve against the working directory

    assert resolve_model_path("meta-llama/Llama-3.2-1B-Instruct") == short
    assert resolve_model_path("Llama-3.2-1B-Instruct") == short
    assert resolve_model_path("org/Qwen3-1.7B") == full
    tok = Tokenizer("meta-llama/Llama-3.2-1B-Instruct")
    assert tok.bos_token_id == tok.token_to_id("<|begin_of_text|>")
    assert Tokenizer("org/Qwen3-1.7B").bos_token_id is None

    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path("google/gemma-3-1b-it")
    msg = str(err.value)
    assert str(models / "google" / "gemma-3-1b-it") in msg and str(models / "gemma-3-1b-it") in msg


def test_existing_local_path_wins(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_REF_MODELS", str(tmp_path / "elsewhere"))
    assert resolve_model_path(CKPT / "gemma3-tiny") == CKPT / "gemma3-tiny"
    assert resolve_model_path(str(CKPT / "gemma3-tiny")) == CKPT / "gemma3-tiny"


def test_folder_without_tokenizer_json(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"holds no tokenizer\.json"):
        Tokenizer(tmp_path)
