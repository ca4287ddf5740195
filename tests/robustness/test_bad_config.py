"""ModelConfig: every field's type and range, never coerced (``2.5`` is not 2, ``"false"`` is not True)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer_ref.config import ConfigError, ModelConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config
from infer_ref.errors import DataError

Edit = Callable[[dict[str, Any]], None]


def _set(key: str, value: Any) -> Edit:
    return lambda raw: raw.__setitem__(key, value)


def _rope(key: str, value: Any) -> Edit:
    return lambda raw: raw["rope_parameters"].__setitem__(key, value)


def _gemma_rope(layer: str, key: str, value: Any) -> Edit:
    return lambda raw: raw["rope_parameters"][layer].__setitem__(key, value)


# (id, family, edit, words the message must contain: the field and the bad value)
CASES: list[tuple[str, str, Edit, tuple[str, ...]]] = [
    ("kv-heads-zero", "llama", _set("num_key_value_heads", 0), ("num_key_value_heads", "0")),
    ("kv-heads-float", "llama", _set("num_key_value_heads", 2.5), ("num_key_value_heads", "2.5")),
    ("kv-heads-string", "llama", _set("num_key_value_heads", "2"), ("num_key_value_heads", "'2'")),
    ("kv-heads-not-divisor", "llama", _set("num_key_value_heads", 3), ("num_key_value_heads (3)",)),
    ("kv-heads-negative", "llama", _set("num_key_value_heads", -2), ("num_key_value_heads", "-2")),
    ("heads-bool", "llama", _set("num_attention_heads", True), ("num_attention_heads", "True")),
    ("heads-float", "llama", _set("num_attention_heads", 4.0), ("num_attention_heads", "4.0")),
    ("vocab-zero", "llama", _set("vocab_size", 0), ("vocab_size", "0")),
    ("vocab-string", "llama", _set("vocab_size", "128"), ("vocab_size", "'128'")),
    ("hidden-negative", "llama", _set("hidden_size", -64), ("hidden_size", "-64")),
    ("hidden-not-multiple-of-heads", "llama", _set("hidden_size", 66), ("hidden_size (66)", "num_attention_heads (4)")),
    ("intermediate-float", "llama", _set("intermediate_size", 128.5), ("intermediate_size", "128.5")),
    ("layers-zero", "llama", _set("num_hidden_layers", 0), ("num_hidden_layers", "0")),
    ("layers-missing", "llama", lambda raw: raw.pop("num_hidden_layers"), ("num_hidden_layers", "missing")),
    ("head-dim-zero", "qwen3", _set("head_dim", 0), ("head_dim", "0")),
    ("head-dim-odd", "qwen3", _set("head_dim", 33), ("head_dim (33)", "even")),
    ("head-dim-string", "qwen3", _set("head_dim", "32"), ("head_dim", "'32'")),
    ("eps-negative", "llama", _set("rms_norm_eps", -1), ("rms_norm_eps", "-1")),
    ("eps-zero", "llama", _set("rms_norm_eps", 0.0), ("rms_norm_eps", "0.0")),
    ("eps-nan", "llama", _set("rms_norm_eps", float("nan")), ("rms_norm_eps", "nan")),
    ("eps-string", "llama", _set("rms_norm_eps", "1e-5"), ("rms_norm_eps", "'1e-5'")),
    ("max-positions-zero", "llama", _set("max_position_embeddings", 0), ("max_position_embeddings", "0")),
    ("max-positions-float", "llama", _set("max_position_embeddings", 512.0), ("max_position_embeddings", "512.0")),
    ("tie-string-false", "llama", _set("tie_word_embeddings", "false"), ("tie_word_embeddings", "'false'")),
    ("tie-int", "llama", _set("tie_word_embeddings", 0), ("tie_word_embeddings", "0")),
    ("attention-bias-string", "llama", _set("attention_bias", "yes"), ("attention_bias", "'yes'")),
    ("mlp-bias-int", "llama", _set("mlp_bias", 1), ("mlp_bias", "1")),
    ("eos-string", "llama", _set("eos_token_id", "12"), ("eos_token_id", "'12'")),
    ("eos-list-with-string", "llama", _set("eos_token_id", [2, "3"]), ("eos_token_id[1]", "'3'")),
    ("eos-negative", "llama", _set("eos_token_id", [-1]), ("eos_token_id[0]", "-1")),
    ("eos-float", "llama", _set("eos_token_id", 2.0), ("eos_token_id", "2.0")),
    ("bos-negative", "llama", _set("bos_token_id", -5), ("bos_token_id", "-5")),
    ("pad-string", "gemma3_text", _set("pad_token_id", "0"), ("pad_token_id", "'0'")),
    ("bos-bool", "llama", _set("bos_token_id", True), ("bos_token_id", "True")),
    ("pad-negative", "gemma3_text", _set("pad_token_id", -1), ("pad_token_id", "-1")),
    ("rope-theta-zero", "llama", _rope("rope_theta", 0), ("rope_theta", "0")),
    ("rope-theta-negative", "qwen3", _rope("rope_theta", -10.0), ("rope_theta", "-10.0")),
    ("rope-theta-inf", "qwen3", _rope("rope_theta", float("inf")), ("rope_theta", "inf")),
    ("rope-factor-zero", "llama", _rope("factor", 0), ("factor", "0")),
    ("rope-factor-string", "llama", _rope("factor", "8"), ("factor", "'8'")),
    ("rope-high-not-above-low", "llama", _rope("high_freq_factor", 1.0), ("high_freq_factor (1.0)", "low_freq_factor (1.0)")),
    ("rope-low-freq-negative", "llama", _rope("low_freq_factor", -1.0), ("low_freq_factor", "-1.0")),
    ("rope-original-max-float", "llama", _rope("original_max_position_embeddings", 32.5), ("original_max_position_embeddings", "32.5")),
    ("rope-llama3-missing-part", "llama", lambda raw: raw["rope_parameters"].pop("low_freq_factor"), ("low_freq_factor",)),
    ("rope-unknown-type", "llama", _rope("rope_type", "yarn"), ("rope_type", "'yarn'")),
    ("rope-linear-without-factor", "qwen3", _rope("rope_type", "linear"), ("rope_type 'linear'", "factor")),
    ("rope-parameters-list", "qwen3", _set("rope_parameters", [1, 2]), ("rope_parameters", "[1, 2]")),
    ("gemma-local-theta-zero", "gemma3_text", _gemma_rope("sliding_attention", "rope_theta", 0), ("sliding_attention.rope_theta", "0")),
    ("gemma-global-rope-string", "gemma3_text", lambda raw: raw["rope_parameters"].__setitem__("full_attention", "x"), ("full_attention", "'x'")),
    ("softcap-zero", "gemma3_text", _set("final_logit_softcapping", 0), ("final_logit_softcapping", "0")),
    ("softcap-negative", "gemma3_text", _set("final_logit_softcapping", -30.0), ("final_logit_softcapping", "-30.0")),
    ("query-scalar-zero", "gemma3_text", _set("query_pre_attn_scalar", 0), ("query_pre_attn_scalar", "0")),
    ("window-zero", "gemma3_text", _set("sliding_window", 0), ("sliding_window", "0")),
    ("window-float", "gemma3_text", _set("sliding_window", 6.5), ("sliding_window", "6.5")),
    ("window-null-with-sliding-layers", "gemma3_text", _set("sliding_window", None), ("sliding_window", "None")),
    ("layer-types-too-short", "gemma3_text", _set("layer_types", ["full_attention"]), ("layer_types has 1 entries", "num_hidden_layers is 4")),
    ("layer-types-unknown", "gemma3_text", _set("layer_types", ["local"] * 4), ("layer_types", "'local'")),
    ("layer-types-string", "gemma3_text", _set("layer_types", "full_attention"), ("layer_types", "'full_attention'")),
    ("window-pattern-zero", "gemma3_text", lambda raw: (raw.pop("layer_types"), raw.__setitem__("sliding_window_pattern", 0)), ("sliding_window_pattern", "0")),
    ("activation-unknown", "llama", _set("hidden_act", "relu"), ("activation", "'relu'")),
    ("activation-not-string", "gemma3_text", _set("hidden_activation", 7), ("activation", "7")),
    ("attn-softcapping-set", "gemma3_text", _set("attn_logit_softcapping", 50.0), ("attn_logit_softcapping",)),
    ("qwen-use-sliding-string", "qwen3", _set("use_sliding_window", "true"), ("use_sliding_window", "'true'")),
    ("qwen-max-window-layers-negative", "qwen3", lambda raw: raw.update(use_sliding_window=True, sliding_window=8, max_window_layers=-1), ("max_window_layers", "-1")),
    ("model-type-unknown", "llama", _set("model_type", "mistral"), ("model_type", "'mistral'")),
    ("model-type-list", "llama", _set("model_type", ["llama"]), ("model_type", "['llama']")),
    ("gemma3-without-text-config", "llama", lambda raw: raw.update(model_type="gemma3"), ("text_config",)),
]


@pytest.mark.parametrize(("family", "edit", "words"), [c[1:] for c in CASES], ids=[f"config-{c[0]}" for c in CASES])
def test_bad_config_is_refused_naming_the_field(family: str, edit: Edit, words: tuple[str, ...]) -> None:
    raw = copy.deepcopy(tiny_config(family))
    ModelConfig.from_hf_dict(raw)  # the unedited config is valid: the edit alone is refused
    edit(raw)
    before = copy.deepcopy(raw)
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_hf_dict(raw)
    assert isinstance(info.value, DataError) and isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert repr(raw) == repr(before)  # the caller's dict is not modified


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ("config.json", "cannot read")),
        ("[1, 2, 3]", ("config.json", "JSON object", "list")),
        ("", ("config.json", "cannot read")),
        ("\xff\xfe", ("config.json",)),
    ],
    ids=["config-file-not-json", "config-file-a-list", "config-file-empty", "config-file-not-utf8"],
)
def test_unreadable_config_file_names_the_file(tmp_path: Path, content: str, words: tuple[str, ...]) -> None:
    path = tmp_path / "config.json"
    if content == "\xff\xfe":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_pretrained(tmp_path)
    for word in words:
        assert word in str(info.value)


def test_config_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path)


def test_eos_beyond_the_vocabulary_is_accepted() -> None:
    """An EOS id the model can never produce changes nothing; the conformance kit uses one to switch EOS off."""
    assert ModelConfig.from_hf_dict({**tiny_config("llama"), "eos_token_id": [10_000]}).eos_token_ids == (10_000,)


def test_valid_values_are_kept_exactly() -> None:
    """The checks do not coerce valid values either: the fingerprint sees the file's values."""
    raw = tiny_config("gemma3_text")
    config = ModelConfig.from_hf_dict(raw)
    assert config.query_pre_attn_scalar == 24 and isinstance(config.query_pre_attn_scalar, int)
    assert config.eos_token_ids == (1, 3) and config.pad_token_id == 0
    assert json.dumps(raw) == json.dumps(tiny_config("gemma3_text"))
