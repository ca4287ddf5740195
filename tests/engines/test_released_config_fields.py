"""Every kit checkpoint's config.json carries every field the released config of its family carries
(old: the long-context checkpoints had no ``hidden_act``, so an engine that reads configs strictly
could not start on the Llama 3.2 and Qwen 3 ones, and that family was "not judged")."""

from __future__ import annotations

import json
from pathlib import Path

from infer_ref.conformance.engines.workloads.checkpoints import ENGINE_CHECKPOINTS, write_all
from infer_ref.conformance.engines.workloads.long_checkpoints import LONG_CHECKPOINTS, LONG_STYLE

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"

# The top-level keys of the released config.json files, as transformers 4 wrote them:
# meta-llama/Llama-3.2-1B, Qwen/Qwen3-0.6B and google/gemma-3-1b-it.
RELEASED = {
    "llama": {
        "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
        "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "mlp_bias", "model_type",
        "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pretraining_tp", "rms_norm_eps", "rope_scaling",
        "rope_theta", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "vocab_size",
    },
    "qwen3": {
        "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
        "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "max_window_layers", "model_type",
        "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
        "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "use_sliding_window",
        "vocab_size",
    },
    "gemma3_text": {
        "architectures", "attention_bias", "attention_dropout", "attn_logit_softcapping", "bos_token_id", "cache_implementation",
        "eos_token_id", "final_logit_softcapping", "head_dim", "hidden_activation", "hidden_size", "initializer_range",
        "intermediate_size", "max_position_embeddings", "model_type", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "pad_token_id", "query_pre_attn_scalar", "rms_norm_eps", "rope_local_base_freq", "rope_scaling",
        "rope_theta", "sliding_window", "sliding_window_pattern", "torch_dtype", "transformers_version", "use_cache", "vocab_size",
    },
}  # fmt: skip
# transformers_version records the writing tool, not the model: the kit's writer is not transformers.
METADATA = {"transformers_version"}
# transformers 5 renamed the RoPE and dtype fields, spelled Gemma 3's layer pattern out, and keeps
# cache_implementation in generation_config.json (the fixtures, written by transformers 5, show it).
T5_RENAMED = {"rope_theta": "rope_parameters", "rope_scaling": "rope_parameters", "torch_dtype": "dtype",
              "rope_local_base_freq": "rope_parameters", "sliding_window_pattern": "layer_types"}  # fmt: skip
T5_DROPPED = {"cache_implementation"}


def _expected(model_type: str, style: str) -> set[str]:
    fields = RELEASED[model_type] - METADATA
    return fields if style == "t4" else {T5_RENAMED.get(f, f) for f in fields - T5_DROPPED}


def _folders(root: Path) -> list[tuple[Path, str]]:
    engine = write_all(root / "engine")
    long = write_all(root / "long", specs=LONG_CHECKPOINTS, styles=(LONG_STYLE,))
    styles = [style for _ in ENGINE_CHECKPOINTS for style in ("t4", "t5")] + [LONG_STYLE] * len(long)
    fixtures = [(FIXTURES / name, "t5") for name in ("llama-tiny", "qwen3-tiny", "gemma3-tiny")]  # written by transformers 5
    return [*zip([*engine, *long], styles, strict=True), *fixtures]


def test_every_kit_checkpoint_carries_every_field_its_released_config_carries(tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    assert {json.loads((f / "config.json").read_text())["model_type"] for f, _ in folders} == set(RELEASED)
    missing = {}
    for folder, style in folders:
        config = json.loads((folder / "config.json").read_text())
        if lacks := _expected(config["model_type"], style) - set(config):
            missing[folder.name] = sorted(lacks)
    assert not missing, missing
