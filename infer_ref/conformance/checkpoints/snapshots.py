"""Deterministic random checkpoints in Hugging Face layout.

Used wherever a test needs a model without downloading one: tiny configs that exercise every
feature of a family (GQA, llama3 RoPE scaling, QK-norm, query_pre_attn_scalar, sliding windows),
and configs with the real shapes of Llama-3.2-1B, Qwen3-1.7B and gemma-3-1b-it. Weights are drawn
from a seeded CPU generator in sorted-name order, so a (config, seed, init) triple always gives
the same bytes; :func:`state_digest` fingerprints them. Snapshots are written with HF tensor names
so that transformers and infer_ref each load them with their own code.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from infer_ref.config import ModelConfig
from infer_ref.loader import build_on_meta, checkpoint_shapes

FAMILIES = ("llama", "qwen3", "gemma3_text")

# Small configs in HF's own config.json format (new style: rope_parameters, layer_types).
# The keys every Gemma 3 config.json here shares, in their place (before its eos_token_id).
_GEMMA3_TAIL: dict[str, Any] = {
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 2,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # GQA 2:1
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        # head_dim 16 -> wavelengths 6.3, 19.9, 62.8, ...: with original context 32 the bands are
        # "keep" (< 8), "smooth" (8..32) and "divide by factor" (> 32): all three are exercised.
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
    },
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # != hidden / heads (16), as in the real Qwen3 models
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "tie_word_embeddings": False,  # the untied head path
        "bos_token_id": None,
        "eos_token_id": [2, 3],
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,  # as gemma-3-1b: one KV head
        "head_dim": 32,
        "query_pre_attn_scalar": 24,  # != head_dim: a wrong scale changes the logits
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        **_GEMMA3_TAIL,
        "eos_token_id": [1, 3],
    },
}

# The real shapes of the three dev models (the table of docs/design.md), in their own config.json format.
REAL_SHAPE_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    },
    "qwen3-1.7b": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "rope_theta": 1_000_000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    "gemma-3-1b-it": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": 262144,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": None,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        **_GEMMA3_TAIL,
        "eos_token_id": [1, 106],
    },
}


@dataclass(frozen=True)
class WeightInit:
    """How random weights are drawn.

    Linear weights ~ N(0, (gain / sqrt(fan_in))^2); embeddings ~ N(0, embed_std^2); norm weights
    are ``1 + norm_jitter * N(0, 1)`` (Gemma stores the offset from 1, so just the jitter). A gain
    above 1 makes logits far from uniform, so greedy choices are decided by clear margins.
    """

    gain: float = 1.0
    embed_std: float = 1.0
    norm_jitter: float = 0.1

    def describe(self) -> str:
        return (
            f"seeded CPU torch.Generator, parameters in sorted-name order: linear N(0,({self.gain}/sqrt(fan_in))^2), "
            f"embedding N(0,{self.embed_std}^2), norms 1+{self.norm_jitter}*N(0,1) (Gemma: offset only)"
        )


# Inits under which the tiny configs give varied greedy continuations and clear margins. Gemma
# needs small embeddings: they are multiplied by sqrt(hidden), and a residual stream dominated by
# the input embedding makes a tied head repeat the last token forever.
TINY_INITS: dict[str, WeightInit] = {
    "llama": WeightInit(gain=2.0, embed_std=0.3),
    "qwen3": WeightInit(gain=2.0, embed_std=0.3),
    "gemma3_text": WeightInit(gain=3.0, embed_std=0.1, norm_jitter=0.5),
}


def tiny_config(family: str, **overrides: Any) -> dict[str, Any]:
    """A copy of the tiny config of ``family`` with ``overrides`` applied."""
    if family not in TINY_CONFIGS:
        raise KeyError(f"unknown family {family!r}; known: {', '.join(TINY_CONFIGS)}")
    config = copy.deepcopy(TINY_CONFIGS[family])
    config.update(overrides)
    return config


def random_state_dict(
    hf_config: Mapping[str, Any], seed: int, init: WeightInit = WeightInit(), dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """HF-named tensors for ``hf_config``, drawn deterministically from ``seed``."""
    config = ModelConfig.from_hf_dict(hf_config)
    shapes = checkpoint_shapes(build_on_meta(config))
    generator = torch.Generator(device="cpu").manual_seed(seed)
    gemma = config.model_type == "gemma3_text"
    state: dict[str, Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith("norm.weight"):
            tensor = init.norm_jitter * noise if gemma else 1.0 + init.norm_jitter * noise
        elif name == "embed_tokens.weight":
            tensor = init.embed_std * noise
        elif name.endswith(".bias"):
            tensor = 0.02 * noise
        else:
            tensor = noise * (init.gain / math.sqrt(shape[-1]))
        state[_hf_name(name)] = tensor.to(dtype)
    return state


def state_digest(state: Mapping[str, Tensor]) -> str:
    """sha256 over names, shapes, dtypes and bytes of every tensor, in sorted-name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def write_snapshot(folder: str | Path, hf_config: Mapping[str, Any], state: Mapping[str, Tensor]) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (HF layout) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(hf_config), indent=2, sort_keys=True))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def random_snapshot(
    folder: str | Path,
    hf_config: Mapping[str, Any],
    seed: int = 0,
    init: WeightInit = WeightInit(),
    dtype: torch.dtype = torch.float32,
) -> Path:
    """A random checkpoint of ``hf_config`` written to ``folder``."""
    return write_snapshot(folder, hf_config, random_state_dict(hf_config, seed, init, dtype))


def _hf_name(name: str) -> str:
    return name if name.startswith("lm_head.") else f"model.{name}"
