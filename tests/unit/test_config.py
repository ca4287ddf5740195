"""ModelConfig: both config formats, every family, and every rejection."""

from __future__ import annotations

import json

import pytest

from infer_ref.config import FULL_ATTENTION, SLIDING_ATTENTION, ConfigError, ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, tiny_config

transformers = pytest.importorskip("transformers")


def _hf(raw: dict) -> object:
    """transformers' own parse of the same dict: the oracle for defaults and derived fields."""
    return transformers.AutoConfig.for_model(**raw)


@pytest.mark.parametrize("name", sorted(REAL_SHAPE_CONFIGS))
def test_real_shapes_parse_like_transformers(name: str) -> None:
    raw = REAL_SHAPE_CONFIGS[name]
    ours = ModelConfig.from_hf_dict(raw)
    hf = _hf(raw)
    assert ours.num_hidden_layers == hf.num_hidden_layers
    assert ours.num_key_value_heads == hf.num_key_value_heads
    assert ours.computed_head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert list(ours.layer_types) == list(getattr(hf, "layer_types", None) or [FULL_ATTENTION] * hf.num_hidden_layers)
    assert ours.tie_word_embeddings == hf.tie_word_embeddings


def test_model_facts_of_design_table() -> None:
    llama = ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS["llama-3.2-1b"])
    qwen = ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS["qwen3-1.7b"])
    gemma = ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS["gemma-3-1b-it"])
    assert (llama.computed_head_dim, llama.rope.rope_type, llama.rope.factor) == (64, "llama3", 32.0)
    assert llama.rope.original_max_position_embeddings == 8192 and llama.rope.theta == 500000.0
    assert (qwen.computed_head_dim, qwen.num_key_value_heads, qwen.has_qk_norm) == (128, 8, True)
    # Gemma 3 1B: global layers 5, 11, 17, 23 (every sixth); local RoPE 1e4, global 1e6.
    assert [i for i in range(26) if not gemma.is_sliding(i)] == [5, 11, 17, 23]
    assert gemma.rope_for_layer_type(SLIDING_ATTENTION).theta == 10_000.0
    assert gemma.rope_for_layer_type(FULL_ATTENTION).theta == 1_000_000.0
    assert gemma.attention_scale == 256**-0.5
    assert gemma.window_for_layer(0) == 512 and gemma.window_for_layer(5) is None


def test_old_and_new_gemma_formats_agree() -> None:
    old = REAL_SHAPE_CONFIGS["gemma-3-1b-it"]
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern")}
    new["layer_types"] = [SLIDING_ATTENTION if (i + 1) % 6 else FULL_ATTENTION for i in range(26)]
    new["rope_parameters"] = {
        FULL_ATTENTION: {"rope_type": "default", "rope_theta": 1_000_000.0},
        SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10_000.0},
    }
    a, b = ModelConfig.from_hf_dict(old), ModelConfig.from_hf_dict(new)
    assert a == b and a.fingerprint() == b.fingerprint()


def test_old_and_new_llama_rope_formats_agree() -> None:
    old = REAL_SHAPE_CONFIGS["llama-3.2-1b"]
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {**old["rope_scaling"], "rope_theta": old["rope_theta"]}
    assert ModelConfig.from_hf_dict(old) == ModelConfig.from_hf_dict(new)


def test_nested_gemma3_config_uses_text_config() -> None:
    text = tiny_config("gemma3_text")
    nested = {"model_type": "gemma3", "text_config": {k: v for k, v in text.items() if k != "model_type"}, "vision_config": {}}
    assert ModelConfig.from_hf_dict(nested) == ModelConfig.from_hf_dict(text)


def test_from_pretrained_reads_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("qwen3")))
    assert ModelConfig.from_pretrained(tmp_path) == ModelConfig.from_hf_dict(tiny_config("qwen3"))


def test_fingerprint_changes_with_any_field() -> None:
    base = ModelConfig.from_hf_dict(tiny_config("gemma3_text"))
    other = ModelConfig.from_hf_dict(tiny_config("gemma3_text", sliding_window=7))
    assert base.fingerprint() != other.fingerprint()


def test_eos_ids_int_or_list() -> None:
    assert ModelConfig.from_hf_dict(tiny_config("llama", eos_token_id=5)).eos_token_ids == (5,)
    assert ModelConfig.from_hf_dict(tiny_config("llama", eos_token_id=[5, 6])).eos_token_ids == (5, 6)


def test_qwen3_sliding_only_when_enabled() -> None:
    off = ModelConfig.from_hf_dict(tiny_config("qwen3", sliding_window=4))
    on = ModelConfig.from_hf_dict(tiny_config("qwen3", sliding_window=4, use_sliding_window=True, max_window_layers=1))
    assert off.sliding_window is None and set(off.layer_types) == {FULL_ATTENTION}
    assert on.layer_types == (FULL_ATTENTION, SLIDING_ATTENTION) and on.sliding_window == 4
    assert list(on.layer_types) == list(_hf(tiny_config("qwen3", sliding_window=4, use_sliding_window=True, max_window_layers=1)).layer_types)


# -- rejections -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model_type": "mistral"}, "unsupported model_type 'mistral'; supported: llama, qwen3, gemma3_text, gemma3"),
        ({"model_type": None}, "unsupported model_type None"),
        ({**tiny_config("llama"), "hidden_size": None}, "missing required field(s): hidden_size"),
        ({k: v for k, v in tiny_config("qwen3").items() if k not in ("vocab_size", "num_hidden_layers")}, "vocab_size, num_hidden_layers"),
        (tiny_config("llama", num_key_value_heads=3), "must be a positive multiple of num_key_value_heads (3)"),
        (tiny_config("llama", hidden_act="relu"), "unsupported activation 'relu'"),
        (tiny_config("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1.0, "factor": 2}), "unsupported rope_type 'yarn'"),
        (tiny_config("llama", rope_parameters={"rope_type": "llama3", "rope_theta": 1.0, "factor": 2}), "missing low_freq_factor"),
        (tiny_config("gemma3_text", layer_types=["sliding_attention"]), "layer_types has 1 entries but num_hidden_layers is 4"),
        (tiny_config("gemma3_text", layer_types=["local"] * 4), "unknown layer type(s) ['local']"),
        (tiny_config("gemma3_text", sliding_window=0), "sliding layers need a positive sliding_window"),
        (tiny_config("gemma3_text", attn_logit_softcapping=50.0), "attn_logit_softcapping is not supported"),
        (tiny_config("llama", vocab_size=-1), "vocab_size must be a positive integer, got -1"),
        ({"model_type": "gemma3"}, "gemma3 config has no 'text_config'"),
    ],
)
def test_bad_configs_name_the_problem(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf_dict(raw)
    assert message in str(err.value)


def test_missing_config_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path)


def test_config_is_immutable() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("llama"))
    with pytest.raises(AttributeError):
        config.vocab_size = 3  # type: ignore[misc]
