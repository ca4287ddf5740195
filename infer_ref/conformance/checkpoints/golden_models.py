"""Synthetic models: a config plus a seed, weights drawn by a counter-based generator that gives
the same bits on any CPU or GPU (splitmix64 hashes summed into an Irwin-Hall approximation of a
normal, scaled in float32), and the seeded prompts of their golden files."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from infer_ref.config import ModelConfig

_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 24


def _s64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)
# Sum of four uniform 16-bit integers: mean 4 * 65535 / 2, variance 4 * (65536^2 - 1) / 12.
_IH_MEAN = 2 * 65535
_IH_STD = math.sqrt((65536**2 - 1) / 3)
GENERATOR_NAME = "splitmix64-irwin-hall4-v1"
GENERATOR_DESCRIPTION = (
    "counter-based and device-independent: element i of tensor NAME is z = splitmix64(key + (i+1) * "
    "0x9E3779B97F4A7C15) with key = first 8 bytes (little-endian) of sha256('SEED/NAME'); noise = "
    "(sum of z's four 16-bit lanes - 131070) / 37837.23 (Irwin-Hall(4), unit variance), computed in "
    "int64, then multiplied by the init scale in float32 and rounded to the weight dtype"
)


def _srl(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _noise_into(out: Tensor, key: int, scale: float, offset: float) -> None:
    """Fill flat ``out`` with ``offset + scale * noise``, identical bits on every device."""
    numel = out.numel()
    device = out.device
    factor = torch.tensor(scale / _IH_STD, dtype=torch.float32, device=device)
    flat = out.view(-1)
    for start in range(0, numel, _CHUNK):
        end = min(start + _CHUNK, numel)
        z = torch.arange(start + 1, end + 1, dtype=torch.int64, device=device) * _GAMMA + key
        z = (z ^ _srl(z, 30)) * _MIX1
        z = (z ^ _srl(z, 27)) * _MIX2
        z = z ^ _srl(z, 31)
        lanes = (z & 0xFFFF) + (_srl(z, 16) & 0xFFFF) + (_srl(z, 32) & 0xFFFF) + _srl(z, 48)
        values = (lanes - _IH_MEAN).to(torch.float32) * factor
        if offset:
            values = values + offset
        flat[start:end] = values.to(out.dtype)


def _tensor_key(seed: int, name: str) -> int:
    return _s64(int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little"))


def synthetic_state_dict(
    hf_config: Mapping[str, Any],
    seed: int,
    init: Any,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> dict[str, Tensor]:
    """HF-named weights for ``hf_config`` from ``seed``, the same bits on CPU and on any GPU.

    ``init`` is a :class:`SyntheticInit` (or a ``testing.synthetic.WeightInit``): linear weights have std ``gain / sqrt(fan_in)``, embeddings
    ``embed_std``, norm weights ``1 + norm_jitter * noise`` (Gemma stores the offset from 1, so
    just ``norm_jitter * noise``; see ``post_norm_gain``), biases 0.02. See :data:`GENERATOR_DESCRIPTION`.
    """
    from infer_ref.loader import build_on_meta, checkpoint_shapes

    config = ModelConfig.from_hf_dict(hf_config)
    shapes = checkpoint_shapes(build_on_meta(config))
    gemma = config.model_type == "gemma3_text"
    state: dict[str, Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        post_gain = float(getattr(init, "post_norm_gain", 1.0))
        if gemma and post_gain != 1.0 and name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            # effective weight (1 + w) = post_gain * (1 + jitter * noise)
            scale, offset = post_gain * float(init.norm_jitter), post_gain - 1.0
        elif name.endswith("norm.weight"):
            scale, offset = float(init.norm_jitter), (0.0 if gemma else 1.0)
        elif name == "embed_tokens.weight":
            scale, offset = float(init.embed_std), 0.0
        elif name.endswith(".bias"):
            scale, offset = 0.02, 0.0
        else:
            scale, offset = float(init.gain) / math.sqrt(shape[-1]), 0.0
        tensor = torch.empty(shape, dtype=dtype, device=device)
        _noise_into(tensor, _tensor_key(seed, name), scale, offset)
        state[name if name.startswith("lm_head.") else f"model.{name}"] = tensor
    return state


def weights_digest(state: Mapping[str, Tensor]) -> str:
    """sha256 over names, shapes, dtypes and bytes (``infer_ref.conformance.checkpoints.snapshots.state_digest``)."""
    from infer_ref.conformance.checkpoints.snapshots import state_digest

    return state_digest(state)


@dataclass(frozen=True)
class SyntheticInit:
    """How synthetic weights are scaled (the fields of ``testing.synthetic.WeightInit``, plus one).

    ``post_norm_gain`` multiplies Gemma's post-attention and post-feedforward norm weights: each
    sub-layer then adds about that RMS to the residual stream. Gemma scales its embeddings by
    sqrt(hidden) and ties them to the head, so with gain 1 the input token's own embedding
    dominates the last hidden state and the model just repeats its input with a margin of ~80
    nats; a gain of 6 makes the attention (the context) and the MLPs dominate instead.
    """

    gain: float = 1.0
    embed_std: float = 1.0
    norm_jitter: float = 0.1
    post_norm_gain: float = 1.0


@dataclass(frozen=True)
class PromptCase:
    """A seeded random prompt: ``prompt_len`` ids drawn from the vocabulary, then ``new_tokens`` greedy steps."""

    name: str
    prompt_len: int
    new_tokens: int
    seed: int


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic model: a config, a weight seed and init, and the prompts its golden file holds."""

    name: str
    hf_config: Mapping[str, Any]
    seed: int
    init: SyntheticInit
    cases: tuple[PromptCase, ...]


def _synthetic_specs() -> dict[str, SyntheticSpec]:
    from infer_ref.conformance.checkpoints.golden_names import REAL_SHAPE_MODELS, STANDIN_MODELS
    from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, tiny_config

    # Logit std ~ embed_std * sqrt(hidden) (tied head over a unit-RMS final norm): 0.15 gives
    # ~5-7 nats, far from uniform over 128k-262k tokens yet with bf16 logits rounded finely
    # enough (1/8 below 32) that a tie-aware eps of a fraction of a nat is meaningful.
    real_init = SyntheticInit(gain=1.0, embed_std=0.15, norm_jitter=0.1)
    gemma_init = SyntheticInit(gain=1.0, embed_std=0.15, norm_jitter=0.1, post_norm_gain=6.0)
    # Gemma's window is 512: the first prompt crosses it in prefill (and decode runs entirely past
    # it); the second starts below it and crosses it during decode, at step 64. 128 new tokens each.
    # Llama and Qwen3 have no window: one long prompt is enough for them.
    prefill_case = PromptCase("prefill-crosses-window", prompt_len=600, new_tokens=128, seed=1)
    decode_case = PromptCase("decode-crosses-window", prompt_len=448, new_tokens=128, seed=2)
    specs = {}
    for name in REAL_SHAPE_MODELS:
        gemma = REAL_SHAPE_CONFIGS[name]["model_type"].startswith("gemma")
        specs[name] = SyntheticSpec(name, REAL_SHAPE_CONFIGS[name], seed=0, init=gemma_init if gemma else real_init,
                                    cases=(prefill_case, decode_case) if gemma else (prefill_case,))
    # Small stand-ins of the same structure (window 16), for dry runs of the GPU flow on CPU.
    standin_cases = (
        PromptCase("prefill-crosses-window", prompt_len=24, new_tokens=24, seed=1),
        PromptCase("decode-crosses-window", prompt_len=10, new_tokens=20, seed=2),
    )
    standin_init = SyntheticInit(gain=1.0, embed_std=0.6, norm_jitter=0.1)
    for name, family in STANDIN_MODELS.items():
        overrides: dict[str, Any] = {"vocab_size": 512}
        if family == "gemma3_text":
            overrides["sliding_window"] = 16
        specs[name] = SyntheticSpec(name, tiny_config(family, **overrides), seed=0, init=standin_init, cases=standin_cases)
    return specs


SYNTHETIC_MODELS: dict[str, SyntheticSpec] = _synthetic_specs()
