"""Local Hugging Face snapshot -> infer_ref model.

A snapshot is a folder with ``config.json`` and either ``model.safetensors`` or a sharded
``model.safetensors.index.json``. Checkpoint names are HF's (``model.layers.0.self_attn.q_proj.weight``);
infer_ref's modules use the same names without the ``model.`` prefix, so the mapping is a prefix
strip. Gemma 3 multimodal checkpoints (``model_type: gemma3``) load their text decoder only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from infer_ref.config import ModelConfig
from infer_ref.models import DecoderLM, model_class
from infer_ref.paths import resolve_model_path

# Prefixes under which HF stores the decoder, most specific first.
_DECODER_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
# Tensors of a multimodal checkpoint that the text decoder does not use.
_IGNORED_PREFIXES = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector.")


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not match the model its config describes."""


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> tuple[DecoderLM, ModelConfig]:
    """Load a local HF snapshot into an infer_ref model in eval mode.

    ``path`` is a snapshot folder or a name resolved under ``$INFER_REF_MODELS``; nothing is ever
    downloaded. Missing, unexpected or mis-shaped tensors raise :class:`CheckpointError` naming them.
    """
    folder = resolve_model_path(path)
    config = ModelConfig.from_pretrained(folder)
    state = read_safetensors(folder)
    model = build_on_meta(config)
    state = _match_names(state, model)
    _check_tensors(state, model)
    model.load_state_dict({k: v.to(dtype=dtype, device=device) for k, v in state.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.reset_buffers(device)
    return model.eval(), config


def build_on_meta(config: ModelConfig) -> DecoderLM:
    """Construct without allocating or initialising weights (they are about to be loaded)."""
    with torch.device("meta"):
        return model_class(config)(config)


def read_safetensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a snapshot, single-file or sharded."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        files: Iterable[Path] = [single]
    elif index.is_file():
        with index.open() as fh:
            weight_map = json.load(fh)["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(
            f"{folder} has no model.safetensors or model.safetensors.index.json: expected a Hugging Face snapshot"
        )
    state: dict[str, Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                state[name] = f.get_tensor(name)
    return state


def _match_names(state: dict[str, Tensor], model: DecoderLM) -> dict[str, Tensor]:
    """HF tensor names -> this model's parameter names."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(_IGNORED_PREFIXES):
            continue
        out[_strip_prefix(name)] = tensor
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)  # tied: the head is the embedding, whatever the file holds
    return out


def _strip_prefix(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    if name.startswith("language_model.lm_head."):
        return name.removeprefix("language_model.")
    for prefix in _DECODER_PREFIXES:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return name


def _check_tensors(state: dict[str, Tensor], model: DecoderLM) -> None:
    expected = {name: p.shape for name, p in model.named_parameters(remove_duplicate=True)}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = [
        f"{name}: checkpoint {tuple(state[name].shape)} vs model {tuple(shape)}"
        for name, shape in expected.items()
        if name in state and state[name].shape != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {'; '.join(misshaped)}")
    if problems:
        raise CheckpointError(
            f"checkpoint does not match its {model.config.model_type} config: " + " | ".join(problems)
        )
