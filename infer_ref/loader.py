"""Local Hugging Face snapshot -> infer_ref model.

A snapshot is a folder with ``config.json`` and either ``model.safetensors`` or a sharded
``model.safetensors.index.json``. Checkpoint names are HF's (``model.layers.0.self_attn.q_proj.weight``).
Name mapping, in two steps:

1. strip the decoder prefix: ``model.layers.0.self_attn.q_proj.weight`` -> ``layers.0.self_attn.q_proj.weight``.
   These *checkpoint names* are what every state dict in this project uses (fixtures, synthetic
   weights, golden sources);
2. stack the parts of each :class:`~infer_ref.models.common.PackedLinear`: ``q_proj``/``k_proj``/
   ``v_proj`` become rows of ``qkv_proj``, ``gate_proj``/``up_proj`` rows of ``gate_up_proj``.

Gemma 3 multimodal checkpoints (``model_type: gemma3``) load their text decoder only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from infer_ref.config import ModelConfig
from infer_ref.models import DecoderLM, model_class
from infer_ref.models.common import PackedLinear
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
    model = build_on_meta(config)
    load_weights(model, _match_names(read_safetensors(folder)), dtype=dtype, device=device)
    return model, config


def load_weights(
    model: DecoderLM,
    state: Mapping[str, Tensor],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> DecoderLM:
    """Put checkpoint-named tensors (``layers.0.self_attn.q_proj.weight``, ...) into ``model``.

    ``model`` is typically built on the meta device (:func:`build_on_meta`); its parameters are
    replaced, not copied into. Names and shapes are checked first (:class:`CheckpointError` naming
    every missing, unexpected or mis-shaped tensor); packed projections are stacked; a tied head
    is the embedding whatever the state holds. Returns the model in eval mode.
    """
    state = dict(state)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    _check_tensors(state, model)
    converted = {name: t.to(dtype=dtype, device=device) for name, t in state.items()}
    model.load_state_dict(_stack_packed(converted, model), strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.reset_buffers(model.embed_tokens.weight.device)
    return model.eval()


def checkpoint_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """The tensors a checkpoint holds for ``model``: checkpoint names and shapes.

    The model's parameters (tied ones once), with every packed projection listed as its parts.
    """
    shapes = {name: p.shape for name, p in model.named_parameters(remove_duplicate=True)}
    for packed_name, parts in _packed_parts(model):
        packed = shapes.pop(packed_name)
        for part_name, rows in parts:
            shapes[part_name] = torch.Size((rows, *packed[1:]))
    return shapes


def checkpoint_views(model: nn.Module) -> dict[str, Tensor]:
    """The model's weights under checkpoint names; packed parts are row views of the stacked matrix.

    Nothing is copied: a transformers model loaded from these shares infer_ref's storage.
    """
    params = dict(model.named_parameters(remove_duplicate=True))
    for packed_name, parts in _packed_parts(model):
        packed = params.pop(packed_name).detach()
        rows = [r for _, r in parts]
        params.update(zip([n for n, _ in parts], packed.split(rows), strict=True))
    return {name: t.detach() for name, t in params.items()}


def _packed_parts(model: nn.Module) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """(``layers.0.self_attn.qkv_proj.weight``, [(``layers.0.self_attn.q_proj.weight``, rows), ...]) per packed tensor."""
    for module_name, module in model.named_modules():
        if not isinstance(module, PackedLinear):
            continue
        parent = module_name.rpartition(".")[0]
        prefix = f"{parent}." if parent else ""
        for leaf in ("weight", "bias"):
            if getattr(module, leaf) is not None:
                parts = [(f"{prefix}{part}.{leaf}", rows) for part, rows in module.parts.items()]
                yield f"{module_name}.{leaf}", parts


def _stack_packed(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Checkpoint names -> parameter names: each packed tensor is its parts concatenated by rows."""
    out = dict(state)
    for packed_name, parts in _packed_parts(model):
        out[packed_name] = torch.cat([out.pop(name) for name, _ in parts], dim=0)
    return out


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


def _match_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF tensor names -> checkpoint names (decoder prefix stripped, vision tower dropped)."""
    return {_strip_prefix(name): t for name, t in state.items() if not name.startswith(_IGNORED_PREFIXES)}


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
    expected = checkpoint_shapes(model)
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
