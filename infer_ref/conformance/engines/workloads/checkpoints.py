"""Synthetic checkpoints for the engine tier: tiny models whose config.json carries what engines misread.

An engine parses config.json itself and keeps its own copy of each architecture, so a field it
ignores or reads wrongly is a silent wrong answer for every model that sets it differently from
the common checkpoints. Each :class:`EngineCheckpoint` sets such fields to values the fixtures do
not have (a sliding window that no KV block size divides, GQA with several KV heads, llama3 RoPE
scaling, an untied head, Gemma's ``query_pre_attn_scalar`` different from ``head_dim``, linear
RoPE scaling on Gemma's global layers only) and is written in both config.json styles:

- ``t4``, as transformers 4 wrote it and most published checkpoints still ship it: ``rope_theta``
  and ``rope_scaling``; for Gemma 3 ``rope_local_base_freq`` and ``sliding_window_pattern``;
  ``torch_dtype``;
- ``t5``, as transformers 5 writes it: ``rope_parameters`` (per layer type for Gemma 3),
  ``layer_types``, ``dtype``, and none of the t4 fields.

The two folders of one spec hold the same weights and mean the same model (tested: transformers
gives bitwise-equal logits for both). Weights come from the kit's counter-based generator
(:func:`~infer_ref.conformance.checkpoints.golden_models.synthetic_state_dict`), float32 on disk,
scaled so that greedy steps are decided by clear margins and the context matters (attention, not
the last token alone, decides the next one). The tokenizer files are the fixture's of the same
family, and the vocabulary size and special token ids are read from the fixture's config.json.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from torch import Tensor

from infer_ref.conformance.checkpoints.golden_models import (
    GENERATOR_NAME,
    SyntheticInit,
    synthetic_state_dict,
)
from infer_ref.conformance.checkpoints.snapshots import write_snapshot
from infer_ref.paths import FIXTURE_CHECKPOINTS

Style = Literal["t4", "t5"]
STYLES: tuple[Style, ...] = ("t4", "t5")

# FIXTURE_CHECKPOINTS (repository root/fixtures/checkpoints): the fixtures whose tokenizers the
# synthetic checkpoints borrow.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
# Fields of the fixture's config.json that must match its tokenizer.
TOKEN_FIELDS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
# What write_checkpoint records beside the files; its recipe digest decides whether write_all rewrites.
RECORD_FILE = "SYNTHETIC.json"
# Bump when the way folders are written changes, so cached folders are rewritten.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class WeightEdit:
    """A deterministic edit of a checkpoint's generated weights (HF names, float32), applied before
    they are written: ``apply(state, config)`` returns the edited state. ``name`` and ``version``
    enter the recipe digest, so changing what an edit does (bump ``version``) rewrites cached folders."""

    name: str
    version: int
    apply: Callable[[dict[str, Tensor], Mapping[str, Any]], dict[str, Tensor]]


@dataclass(frozen=True)
class EngineCheckpoint:
    """A synthetic checkpoint: what it stresses, its architecture, and how its weights are drawn.

    ``architecture`` is a config.json in the t5 style without the tokenizer's fields (those come
    from the fixture ``fixture``); :func:`config_json` renders it in either style.
    """

    name: str
    fixture: str
    stresses: tuple[str, ...]
    architecture: Mapping[str, Any]
    seed: int
    init: SyntheticInit
    # Numerics checkpoints (numerics_checkpoints.py) edit the generated weights; None: as generated.
    weight_edit: WeightEdit | None = None

    def folder_name(self, style: Style) -> str:
        return f"{self.name}-{style}"


_GEMMA = EngineCheckpoint(
    name="gemma3-window40-gqa4-qpas20-globalrope-linear",
    fixture="gemma3-tiny",
    stresses=(
        "sliding window 40: no KV block size of 16 or 32 divides it, and it spans a block boundary",
        "GQA 8 query heads on 2 KV heads (ratio 4 with more than one KV head: the head-to-KV mapping "
        "matters)",
        "query_pre_attn_scalar 20 != head_dim 32 (the softmax scale)",
        "linear RoPE scaling (factor 8) on the global layers only; local layers keep their own base",
        "layer types S S F S from a pattern of 3 (t4) or an explicit list (t5)",
        "tied embeddings (no lm_head.weight in the file)",
    ),
    architecture={
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 20,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1024,
        "sliding_window": 40,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    },
    seed=26,
    # Gemma scales its embeddings by sqrt(hidden) and ties them to the head: the post-norm gain makes
    # the sub-layers (the context), not the input token, decide the next token, embed_std sets the
    # logit scale (~3.6 nats std), and norm jitter 0.3 keeps greedy decoding out of short loops.
    # Measured over 600 greedy steps from six random prompts of 60-200 tokens: median top-2 gap
    # 1.1 nats, none below 1e-3, 3.5% below 0.1; 16-41 distinct tokens per 100-step continuation.
    init=SyntheticInit(gain=1.0, embed_std=0.45, norm_jitter=0.3, post_norm_gain=18.0),
)

_LLAMA = EngineCheckpoint(
    name="llama3-ropescaling-mha-untied",
    fixture="llama-tiny",
    stresses=(
        "llama3 RoPE scaling with original_max_position_embeddings 64: positions up to 1024 cross all three "
        "bands",
        "GQA ratio 1 (as many KV heads as query heads)",
        "untied embeddings (lm_head.weight differs from the embedding)",
    ),
    architecture={
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,  # != hidden / heads (16): vLLM's CPU attention has no kernel for head size 16
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1024,
        # head_dim 32, theta 10000: wavelengths 6.3, 11, 20, 35, 63, 112, ...; with an original
        # context of 64 they fall in the "keep" (< 16), "smooth" (16..64) and "divide by factor" (> 64) bands.
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    },
    # Gain 2 doubles the logit scale (untied head over a unit-RMS norm: ~2 nats std) and sharpens
    # attention enough that a token 100 positions back moves the next logprobs by ~1 nat. Measured
    # as for Gemma: median top-2 gap 0.44 nats, none below 1e-3, 13% below 0.1; 72-86 distinct
    # tokens per continuation. Of seeds 26-29 this one had no near-tie; the others 1 or 2 in 200-600.
    seed=28,
    init=SyntheticInit(gain=2.0, embed_std=1.0, norm_jitter=0.1),
)

ENGINE_CHECKPOINTS: tuple[EngineCheckpoint, ...] = (_GEMMA, _LLAMA)
"""The synthetic checkpoints of the engine tier; each is written in both :data:`STYLES`."""


def checkpoint_by_name(name: str) -> EngineCheckpoint:
    for spec in ENGINE_CHECKPOINTS:
        if spec.name == name:
            return spec
    raise KeyError(
        f"no synthetic engine checkpoint named {name!r}; known: "
        f"{', '.join(s.name for s in ENGINE_CHECKPOINTS)}"
    )


# -- config.json in either style ------------------------------------------------------------------


# Fields the released configs carry (meta-llama/Llama-3.2-1B, Qwen/Qwen3-0.6B, google/gemma-3-1b-it)
# that the specs need not state: the values those configs set, which are the kit's models' too (the
# activation each family computes; no dropout, tensor-parallel slicing or sliding window that would
# change an answer). An engine that reads configs strictly then starts on every kit checkpoint.
RELEASED_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
    },
    "qwen3": {
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "sliding_window": None,
        "use_sliding_window": False,
    },
    "gemma3_text": {"attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True},
}


def config_json(spec: EngineCheckpoint, style: Style) -> dict[str, Any]:
    """The config.json of ``spec`` in ``style``, with the fixture's vocabulary and special tokens and
    the released configs' other fields (:data:`RELEASED_DEFAULTS`)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    fixture_config = json.loads((_fixture(spec) / "config.json").read_text(encoding="utf-8"))
    config = {
        **RELEASED_DEFAULTS.get(spec.architecture["model_type"], {}),
        **copy.deepcopy(dict(spec.architecture)),
    }
    if config["model_type"] == "qwen3":
        config.setdefault("max_window_layers", config["num_hidden_layers"])  # as released: every layer
    config.update({k: fixture_config[k] for k in TOKEN_FIELDS if k in fixture_config})
    return _to_t4(config) if style == "t4" else {**config, "dtype": "float32"}


def _to_t4(config: dict[str, Any]) -> dict[str, Any]:
    """A t5-style config rewritten with the fields transformers 4 used for the same model."""
    out = dict(config)
    params = out.pop("rope_parameters")
    if out["model_type"] == "gemma3_text":
        full, local = dict(params["full_attention"]), dict(params["sliding_attention"])
        if local.get("rope_type", "default") != "default":
            raise ValueError("transformers 4 configs cannot scale the RoPE of Gemma's sliding layers")
        out["rope_local_base_freq"] = local["rope_theta"]
        params = full
        out["sliding_window_pattern"] = _pattern_of(out.pop("layer_types"))
        out["cache_implementation"] = (
            "hybrid"  # transformers 4's Gemma 3 configs name their cache (5 keeps it in generation_config)
        )
    params = dict(params)
    out["rope_theta"] = params.pop("rope_theta")
    out["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    out["torch_dtype"] = "float32"
    return out


def _pattern_of(layer_types: Sequence[str]) -> int:
    """The ``sliding_window_pattern`` whose layers (every pattern-th one global) are ``layer_types``."""
    for pattern in range(1, len(layer_types) + 2):
        expected = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(len(layer_types))
        ]
        if expected == list(layer_types):
            return pattern
    raise ValueError(
        f"layer_types {list(layer_types)} follow no sliding_window_pattern: not expressible in a t4 config"
    )


# -- writing -------------------------------------------------------------------------------------


def write_checkpoint(spec: EngineCheckpoint, dest_dir: str | os.PathLike[str], style: Style = "t5") -> Path:
    """Write ``spec`` in ``style`` into ``dest_dir`` (created; files there are replaced) and return it.

    The folder holds config.json, model.safetensors (float32), the fixture's tokenizer.json,
    tokenizer_config.json and generation_config.json, and :data:`RECORD_FILE` with the recipe digest
    and every file's sha256. The same spec and style always give the same bytes.
    """
    dest = Path(dest_dir)
    config = config_json(spec, style)
    state = synthetic_state_dict(config, spec.seed, spec.init)
    if spec.weight_edit is not None:
        state = spec.weight_edit.apply(state, config)
    write_snapshot(dest, config, state)
    for name in TOKENIZER_FILES:
        shutil.copyfile(_fixture(spec) / name, dest / name)
    record = {
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "style": style,
        "stresses": list(spec.stresses),
        "recipe_sha256": recipe_digest(spec, style),
        "generator": GENERATOR_NAME,
        "seed": spec.seed,
        "init": asdict(spec.init),
        "weight_edit": spec.weight_edit.name if spec.weight_edit is not None else None,
        "tokenizer_from": f"fixtures/checkpoints/{spec.fixture}",
        "files": {
            name: _sha256(dest / name) for name in ("config.json", "model.safetensors", *TOKENIZER_FILES)
        },
    }
    (dest / RECORD_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return dest


def write_all(
    root: str | os.PathLike[str],
    progress: Callable[[str], None] | None = None,
    *,
    specs: Sequence[EngineCheckpoint] = ENGINE_CHECKPOINTS,
    styles: Sequence[Style] = STYLES,
) -> list[Path]:
    """Every one of ``specs`` (default :data:`ENGINE_CHECKPOINTS`) in every one of ``styles`` under
    ``root`` (``root/<name>-<style>``).

    A folder whose record matches the current recipe and whose files still hash to what it
    recorded is kept as it is; any other is written afresh through a temporary folder, so an
    interrupted write never leaves a folder that looks complete. ``progress`` hears one line per
    folder written (the first use of a kit writes them all, in a few seconds each).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    todo = [
        (spec, style)
        for spec in specs
        for style in styles
        if not is_current(spec, style, root / spec.folder_name(style))
    ]
    for spec in specs:
        for style in styles:
            dest = root / spec.folder_name(style)
            if (spec, style) in todo:
                if progress is not None:
                    done = todo.index((spec, style)) + 1
                    progress(
                        f"infer_ref: writing engine checkpoint {done} of {len(todo)}: {dest.name} (once; "
                        f"cached in {root})"
                    )
                _write_replacing(spec, style, dest)
            folders.append(dest)
    return folders


def is_current(spec: EngineCheckpoint, style: Style, folder: Path) -> bool:
    """Whether ``folder`` holds ``spec`` in ``style`` as the current code would write it."""
    try:
        record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
        if record.get("recipe_sha256") != recipe_digest(spec, style):
            return False
        files = record["files"]
        return bool(files) and all(_sha256(folder / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def recipe_digest(spec: EngineCheckpoint, style: Style) -> str:
    """sha256 of everything the folder's bytes depend on: config, generator, seed, init, tokenizer files."""
    recipe = {
        "format_version": FORMAT_VERSION,
        "config": config_json(spec, style),
        "generator": GENERATOR_NAME,
        "seed": spec.seed,
        "init": asdict(spec.init),
        "tokenizer_files": {name: _sha256(_fixture(spec) / name) for name in TOKENIZER_FILES},
    }
    if spec.weight_edit is not None:  # absent otherwise: the other checkpoints' digests stay as they were
        recipe["weight_edit"] = [spec.weight_edit.name, spec.weight_edit.version]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _write_replacing(spec: EngineCheckpoint, style: Style, dest: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the folder from an engine run as another user
        write_checkpoint(spec, staging, style)
        # Another process (a parallel test worker) may have written the same folder meanwhile.
        if is_current(spec, style, dest):
            return
        if dest.exists():
            shutil.rmtree(dest)
        try:
            staging.rename(dest)
        except OSError:
            if not is_current(spec, style, dest):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fixture(spec: EngineCheckpoint) -> Path:
    folder = FIXTURE_CHECKPOINTS / spec.fixture
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} does not exist: the synthetic checkpoint {spec.name} borrows its tokenizer from that "
            "fixture"
        )
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
