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

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from infer_ref.config import ModelConfig, read_json_object
from infer_ref.devices import resolve as resolve_device
from infer_ref.errors import DataError, NonFiniteError
from infer_ref.models import DecoderLM, model_class
from infer_ref.models.common import PackedLinear
from infer_ref.paths import require_weights, resolve_model_path

# Prefixes under which HF stores the decoder, most specific first.
_DECODER_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
# Tensors of a multimodal checkpoint that the text decoder does not use.
_IGNORED_PREFIXES = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector.")


class CheckpointError(DataError):
    """A checkpoint that cannot be read, or whose tensors do not match the model its config describes."""


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device | None = None,
    check_weights: bool = False,
) -> tuple[DecoderLM, ModelConfig]:
    """Load a local HF snapshot into an infer_ref model in eval mode.

    ``path`` is a snapshot folder or a name resolved under ``$INFER_REF_MODELS``; nothing is ever
    downloaded. ``device`` defaults to CUDA when available, else the CPU. Missing, unexpected,
    mis-shaped or non-float tensors raise :class:`CheckpointError` naming them; with
    ``check_weights`` a NaN or infinite weight (after the cast to ``dtype``) raises
    :class:`~infer_ref.errors.NonFiniteError` naming the tensors.
    """
    folder = resolve_model_path(path)
    config = ModelConfig.from_pretrained(folder)
    model = build_on_meta(config)
    state = _match_names(read_safetensors(folder))
    load_weights(model, state, dtype=dtype, device=resolve_device(device), check_weights=check_weights)
    return model, config


def load_weights(
    model: DecoderLM,
    state: Mapping[str, Tensor],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    check_weights: bool = False,
) -> DecoderLM:
    """Put checkpoint-named tensors (``layers.0.self_attn.q_proj.weight``, ...) into ``model``.

    ``model`` is typically built on the meta device (:func:`build_on_meta`); its parameters are
    replaced, not copied into. Names, shapes and dtypes are checked first (:class:`CheckpointError`
    naming every missing, unexpected, mis-shaped or non-float tensor; an integer tensor is never
    cast to float); packed projections are stacked; a tied head is the embedding whatever the
    state holds. With ``check_weights`` every weight must be finite after the cast. Returns the
    model in eval mode.
    """
    state = dict(state)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    _check_tensors(state, model)
    converted = {name: t.to(dtype=dtype, device=device) for name, t in state.items()}
    if check_weights:
        check_finite_weights(converted)
    model.load_state_dict(_stack_packed(converted, model), strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.reset_buffers(model.embed_tokens.weight.device)
    return model.eval()


def check_finite_weights(state: Mapping[str, Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming every tensor that holds a NaN or an infinity."""
    bad = []
    for name, tensor in state.items():
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad.append(f"{name} ({int((~finite).sum())} of {tensor.numel()} values)")
    if bad:
        raise NonFiniteError(
            f"non-finite weights (NaN or inf; every logit would be NaN): {', '.join(bad)}; expected finite tensors"
        )


def checkpoint_bytes(path: str | os.PathLike[str]) -> int:
    """Size of a snapshot's safetensors files (decides whether the CLI checks weights by default)."""
    folder = resolve_model_path(path)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors") if f.is_file())


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
    with torch.device("meta"), _initialisers_skipped():
        return model_class(config)(config)


# The initialisers that nn.Linear and nn.Embedding call from their constructors.
_INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_")


@contextlib.contextmanager
def _initialisers_skipped() -> Iterator[None]:
    """``nn.init``'s random initialisers as no-ops while a model is built on meta.

    Initialising a meta tensor computes nothing, but torch's meta kernel for the random ones
    imports ``torch._dynamo`` on first use: 1.5 s of every process that loads a model (the CLI, each
    test worker) for values no one reads. Not thread-safe: ``nn.init`` is patched module-wide.
    """
    saved = {name: getattr(nn.init, name) for name in _INITIALISERS}
    for name in _INITIALISERS:
        setattr(nn.init, name, _leave_as_is)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _leave_as_is(tensor: Tensor, *args: object, **kwargs: object) -> Tensor:
    return tensor


def read_safetensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a snapshot, single-file or sharded.

    A sharded snapshot is read as its index says: each tensor from the shard the index assigns it
    to (a stale copy in another shard is never read), and a tensor the index names but its shard
    lacks is an error. Unreadable files raise :class:`CheckpointError` naming the file.
    """
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    require_weights(folder)
    if single.is_file():
        return _read_shard(single, None)
    by_shard: dict[str, list[str]] = {}
    for name, shard in _weight_map(index).items():
        by_shard.setdefault(shard, []).append(name)
    state: dict[str, Tensor] = {}
    for shard, names in sorted(by_shard.items()):
        state.update(_read_shard(folder / shard, names, index))
    return state


def _weight_map(index: Path) -> dict[str, str]:
    data = read_json_object(index, CheckpointError)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: expected a non-empty 'weight_map' object (tensor name -> shard file)")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise CheckpointError(
                f"{index}: weight_map[{name!r}] is {shard!r}: expected the file name of a shard in the snapshot folder"
            )
    return weight_map


def _read_shard(file: Path, names: list[str] | None, index: Path | None = None) -> dict[str, Tensor]:
    """The tensors ``names`` of one safetensors file (all of them when None)."""
    if not file.is_file():
        raise CheckpointError(f"{index}: shard {file.name} is listed but {file} does not exist")
    out: dict[str, Tensor] = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            present = set(f.keys())
            wanted = sorted(present) if names is None else names
            lacking = sorted(set(wanted) - present)
            if lacking:
                raise CheckpointError(
                    f"{index} assigns {', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''} to {file}, which does not hold them"
                )
            for name in wanted:
                out[name] = f.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"cannot read {file}: {err} (a corrupt or truncated safetensors file?)") from None
    return out


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
    not_float = [f"{name} ({t.dtype})" for name, t in state.items() if not t.is_floating_point()]
    problems = []
    if not_float:
        problems.append(f"non-float tensors (weights must be floating point, never cast from integers): {', '.join(not_float)}")
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
