"""load_model: HF names, packed projections, sharding, tying, multimodal Gemma, and precise errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from infer_ref import CheckpointError, load_model
from infer_ref.conformance.checkpoints.snapshots import random_state_dict, tiny_config, write_snapshot
from infer_ref.loader import build_on_meta, checkpoint_shapes, checkpoint_views


def _write(folder, family="llama", mutate=None, **overrides):
    config = tiny_config(family, **overrides)
    state = random_state_dict(config, seed=0)
    if mutate:
        mutate(state)
    return write_snapshot(folder, config, state), state


def test_loads_values_dtype_device(tmp_path) -> None:
    folder, state = _write(tmp_path)
    model, config = load_model(folder, dtype=torch.float64, device="cpu")
    assert config.model_type == "llama"
    views = checkpoint_views(model)
    assert views["layers.1.self_attn.q_proj.weight"].dtype == torch.float64
    assert torch.equal(views["layers.1.self_attn.q_proj.weight"], state["model.layers.1.self_attn.q_proj.weight"].double())
    assert not model.training


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
def test_packed_projections_stack_checkpoint_rows_in_order(tmp_path, family) -> None:
    """qkv_proj is q, k, v stacked by rows and gate_up_proj is gate, up: checked against the file's tensors."""
    folder, state = _write(tmp_path, family)
    model, _ = load_model(folder, dtype=torch.float32, device="cpu")
    for i, block in enumerate(model.layers):
        hf = lambda name, i=i: state[f"model.layers.{i}.{name}.weight"]  # noqa: E731
        qkv = torch.cat([hf("self_attn.q_proj"), hf("self_attn.k_proj"), hf("self_attn.v_proj")])
        assert torch.equal(block.self_attn.qkv_proj.weight, qkv)
        assert torch.equal(block.mlp.gate_up_proj.weight, torch.cat([hf("mlp.gate_proj"), hf("mlp.up_proj")]))


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
def test_checkpoint_views_round_trip_and_share_storage(tmp_path, family) -> None:
    folder, state = _write(tmp_path, family)
    model, _ = load_model(folder, dtype=torch.float32, device="cpu")
    views = checkpoint_views(model)
    on_file = {k.removeprefix("model."): v for k, v in state.items() if not (k == "lm_head.weight" and model.lm_head.weight is model.embed_tokens.weight)}
    assert sorted(views) == sorted(on_file) == sorted(checkpoint_shapes(build_on_meta(model.config)))
    for name, tensor in views.items():
        assert torch.equal(tensor, on_file[name]), name
    qkv = model.layers[0].self_attn.qkv_proj.weight
    assert views["layers.0.self_attn.k_proj.weight"].untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()


def test_tied_head_is_the_embedding(tmp_path) -> None:
    folder, _ = _write(tmp_path)
    model, _ = load_model(folder, dtype=torch.float32, device="cpu")
    assert model.lm_head.weight is model.embed_tokens.weight


def test_untied_head_loaded(tmp_path) -> None:
    folder, state = _write(tmp_path, "qwen3")
    model, _ = load_model(folder, dtype=torch.float32, device="cpu")
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    assert model.lm_head.weight.data_ptr() != model.embed_tokens.weight.data_ptr()


def test_sharded_checkpoint(tmp_path) -> None:
    config = tiny_config("gemma3_text")
    state = random_state_dict(config, seed=1)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / file))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, _ = load_model(tmp_path, dtype=torch.float32, device="cpu")
    assert torch.equal(model.norm.weight, state["model.norm.weight"])


def test_multimodal_gemma3_loads_text_decoder(tmp_path) -> None:
    text = tiny_config("gemma3_text")
    state = random_state_dict(text, seed=2)
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    renamed["model.vision_tower.patch.weight"] = torch.zeros(2)
    config = {"model_type": "gemma3", "text_config": {k: v for k, v in text.items() if k != "model_type"}}
    write_snapshot(tmp_path, config, renamed)
    model, cfg = load_model(tmp_path, dtype=torch.float32, device="cpu")
    assert cfg.model_type == "gemma3_text"
    assert torch.equal(checkpoint_views(model)["layers.0.mlp.up_proj.weight"], state["model.layers.0.mlp.up_proj.weight"])


def test_missing_tensor_is_named(tmp_path) -> None:
    folder, _ = _write(tmp_path, mutate=lambda s: s.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensors: layers.1.mlp.down_proj.weight"):
        load_model(folder)


def test_unexpected_tensor_is_named(tmp_path) -> None:
    folder, _ = _write(tmp_path, mutate=lambda s: s.update({"model.layers.0.self_attn.rotary.inv_freq2": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match="unexpected tensors: layers.0.self_attn.rotary.inv_freq2"):
        load_model(folder)


def test_missing_part_of_a_packed_projection_is_named(tmp_path) -> None:
    folder, _ = _write(tmp_path, mutate=lambda s: s.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors: layers.0.self_attn.k_proj.weight$"):
        load_model(folder)


def test_misshaped_part_of_a_packed_projection_is_named(tmp_path) -> None:
    folder, _ = _write(tmp_path, mutate=lambda s: s.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(127, 64)}))
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors: layers.1.mlp.up_proj.weight: checkpoint \(127, 64\) vs model \(128, 64\)"):
        load_model(folder)


def test_misshaped_tensor_is_named(tmp_path) -> None:
    folder, _ = _write(tmp_path, mutate=lambda s: s.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors: norm.weight: checkpoint \(63,\) vs model \(64,\)"):
        load_model(folder)


def test_hub_id_is_not_downloaded(monkeypatch) -> None:
    monkeypatch.delenv("INFER_REF_MODELS", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        load_model("meta-llama/Llama-3.2-1B-Instruct")
    assert "never downloads" in str(err.value) and "INFER_REF_MODELS" in str(err.value)


def test_models_env_var_resolves_names(tmp_path, monkeypatch) -> None:
    _write(tmp_path / "Llama-tiny")
    monkeypatch.setenv("INFER_REF_MODELS", str(tmp_path))
    _, config = load_model("some-org/Llama-tiny", dtype=torch.float32)
    assert config.model_type == "llama"


def test_folder_without_weights(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(tmp_path)
