"""Numerics checkpoints: tiny models whose weights make each low-precision recipe error coherent.

A recipe error of bfloat16 or float16 (Gemma's ``1 + w`` rounded in the weight dtype, RMSNorm's
mean square rounded, RoPE frequencies rounded, the embedding normaliser rounded in the wrong
dtype) changes one quantity by at most one rounding of the dtype, which is what a correct engine's
rounding does everywhere. On random weights the error points one way in some channels and
positions and the other way in the rest, and no statistic separates it from correct rounding.
These checkpoints choose the weights so that the error has **one sign everywhere** and is as large
as one rounding allows (docs/low-precision.md, "Recipe errors"):

- :data:`GEMMA3_ONE_PLUS_W_BF16` / :data:`GEMMA3_ONE_PLUS_W_FP16`: every Gemma norm weight ``w``
  is a value for which ``1 + w`` is not representable in the dtype and rounds *down* (the pre,
  q/k and final norms: ``0 < w < ulp(1)/2``; the post norms: ``1 + w`` exactly half an ulp above a
  value with an even last bit, a tie that rounds to even, down). The error is then a scale of
  every norm below 1 by up to 2^-8 (bf16) or 2^-11 (fp16): on the final norm a temperature of the
  logits, on q/k norms one of the attention.
- :data:`LLAMA3_RMS_ANCHOR`: four residual channels hold constants at every position (set by the
  embedding, written by no layer, read by no norm: their norm weights are 0), so every norm's mean
  square lies just below the bfloat16 rounding midpoint :data:`ANCHOR_MIDPOINT`: a mean square
  rounded to bfloat16 rounds down by ~2^-9 at every norm and position. ``rsqrt`` of it is far from
  a power of two, otherwise the canonical recipe ``w * round(x * rstd)`` would snap ``x * rstd``
  back onto the grid and be as coherent as the bug.
- :data:`LLAMA3_ROPE_LONG`: RoPE base 1e4 unscaled, no window, prompts of ~1000 positions: a frequency
  rounded to the dtype turns into a phase error proportional to the query-key distance (at 1000
  positions up to 0.18 rad in bfloat16 and 0.16 in float16, over the frequencies).
- :data:`GEMMA3_HIDDEN304`: hidden size 304, whose square root (17.4356) rounds to 17.375 in
  bfloat16 (-0.35%) and 17.4375 in float16 (+0.011%): the embedding normaliser's rounding is not a
  no-op (it is on every other Gemma checkpoint of the kit: sqrt(64) = 8).
- :data:`LLAMA3_SOFTMAX_SINK`: every prompt starts with an attention sink whose exponential is 1
  while every other key's is below half an ulp of 1: a softmax sum accumulated key by key in the
  dtype never moves from 1, so every attention output is too large by the missing terms (up to 3%
  at position 120), one way everywhere.

Every weight is stored exactly representable in the dtype the checkpoint is for (both, where the
list says so): the float64 oracle and the engine then start from the same numbers, and what
differs is the recipe. They are degenerate as language models (the anchor model is near-bigram),
so the model, cache and schedule bug classes keep the kit's other checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.checkpoints.golden_models import SyntheticInit
from infer_ref.conformance.engines.workloads.checkpoints import EngineCheckpoint, Style, WeightEdit
from infer_ref.conformance.engines.workloads.long_checkpoints import GEMMA3_W512, LLAMA3_ROPE8192

NUMERICS_STYLE: Style = "t5"
LOW_DTYPES = (torch.bfloat16, torch.float16)

# -- rounding the weights onto a dtype's grid ----------------------------------------------------


def exact_in(values: Tensor, dtypes: tuple[torch.dtype, ...]) -> Tensor:
    """``values`` (float32) rounded so that each is exactly representable in every one of ``dtypes``.

    Rounded to the coarsest dtype first (bfloat16: 8 significant bits, which float16 holds too);
    a value float16 cannot hold after that (below its normal range, where it keeps fewer bits, or
    above 65504) becomes 0 if tiny, and is refused if large.
    """
    coarsest = max(dtypes, key=lambda d: torch.finfo(d).eps)
    out = values.float().to(coarsest).float()
    for dtype in dtypes:
        lost = out.to(dtype).float() != out
        if (lost & (out.abs() > 1.0)).any():
            raise ValueError(f"weights of magnitude above {torch.finfo(dtype).max} cannot be held in {dtype}")
        out = torch.where(lost, torch.zeros_like(out), out)
    return out


def _all_exact_in(dtypes: tuple[torch.dtype, ...]) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
    return lambda state: {name: exact_in(t, dtypes) for name, t in state.items()}


def is_exact_in(values: Tensor, dtype: torch.dtype) -> bool:
    """Whether every one of ``values`` survives a round trip through ``dtype`` unchanged."""
    return bool((values.to(dtype).to(values.dtype) == values).all())


# -- Gemma 3: 1 + w rounds down in every channel ---------------------------------------------------

# Pre, q/k and final norms: 0 < w < ulp(1)/2, so 1 + w rounds down to 1 (a 2^-8 or 2^-11 scale at
# most); 16 values just below the midpoint, one per channel in turn (k * 2^-16 for k in 240..255:
# 8 significant bits, exact in bf16). Post norms: 1 + w in [16, 17) exactly halfway between two
# grid values whose lower one has an even last bit, so round-to-nearest-even rounds it down.
_PRE_W = {
    torch.bfloat16: [k * 2.0**-16 for k in range(240, 256)],  # 1 + w < 1 + 2^-8 = the midpoint
    torch.float16: [k * 2.0**-22 for k in range(2032, 2048)],  # 1 + w < 1 + 2^-11 (fp16 ulp 2^-10)
}
_POST_W = {
    torch.bfloat16: [15.0 + 2.0**-4 + m * 2.0**-2 for m in range(4)],  # 16.0625 + m/4: ties at ulp 1/8
    torch.float16: [15.0 + 2.0**-7 + m * 2.0**-5 for m in range(4)],  # 16 + 2^-7 + m/32: ties at ulp 1/64
}
_POST_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")


def one_plus_w_weights(name: str, dim: int, dtype: torch.dtype) -> Tensor:
    """The norm weight ``[dim]`` of the coherent-norm checkpoint for ``dtype`` (cycling through its
    values)."""
    values = _POST_W[dtype] if name.endswith(_POST_NORMS) else _PRE_W[dtype]
    return torch.tensor([values[i % len(values)] for i in range(dim)], dtype=torch.float32)


def _one_plus_w_edit(
    dtype: torch.dtype,
) -> Callable[[dict[str, Tensor], Mapping[str, Any]], dict[str, Tensor]]:
    def edit(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
        out = _all_exact_in((dtype,))(state)
        for name, tensor in out.items():
            if name.endswith("norm.weight"):
                out[name] = one_plus_w_weights(name, tensor.shape[0], dtype)
        return out

    return edit


# Gemma 3 1B's layout at the long checkpoints' width (5 sliding layers to 1 global), with a window
# longer than any numerics prompt: the recipe, not the window, is tested.
_GEMMA_ARCH: dict[str, Any] = {**GEMMA3_W512.architecture, "sliding_window": 4096}
_GEMMA_INIT = SyntheticInit(gain=1.0, embed_std=0.45, norm_jitter=0.3, post_norm_gain=18.0)


def _one_plus_w(dtype: torch.dtype, tag: str) -> EngineCheckpoint:
    return EngineCheckpoint(
        name=f"gemma3-numerics-one-plus-w-{tag}",
        fixture="gemma3-tiny",
        stresses=(
            f"every Gemma norm's 1 + w rounds down in {tag} (a coherent scale below 1 per norm)",
            f"every weight exact in {tag}",
        ),
        architecture=_GEMMA_ARCH,
        seed=52,
        init=_GEMMA_INIT,
        weight_edit=WeightEdit(f"one-plus-w-{tag}", 1, _one_plus_w_edit(dtype)),
    )


GEMMA3_ONE_PLUS_W_BF16 = _one_plus_w(torch.bfloat16, "bf16")
GEMMA3_ONE_PLUS_W_FP16 = _one_plus_w(torch.float16, "fp16")

# -- Llama: every norm's mean square just below a bfloat16 rounding midpoint ----------------------

# bfloat16 holds 1536 and 1544 (ulp 8 in [1024, 2048)): a mean square in (1536, 1540) rounds down
# to 1536. The anchor channels put it at (65536 + 30976 + 1936 + 64) / 64 = 1539.25; each embedding
# row's other channels add 24 / 64 = 0.375 (rows rescaled to that sum of squares), and the layers'
# small writes move it by less than 0.15 (measured: 1539.58 to 1539.74 over the norms of eight
# prompts): ms in [1539.5, 1540) at every norm and position, tested.
ANCHOR_MIDPOINT = 1540.0
ANCHOR_BELOW = 0.5  # ms in [ANCHOR_MIDPOINT - ANCHOR_BELOW, ANCHOR_MIDPOINT)
ANCHOR_VALUES = (256.0, 176.0, 44.0, 8.0)  # squares 2^16, 121 * 2^8, 121 * 2^4, 2^6: exact in bf16
_ANCHOR_OTHERS_SUM_SQUARES = 24.0  # each embedding row's other channels: sum of squares (ms share 0.375)
_ANCHOR_NORM_GAIN = 80.0  # x / rms(x) is ~1/40 in the other channels: the norm weights restore scale
_ANCHOR_WRITE_SCALE = 0.01  # o_proj / down_proj: the layers move the other channels a little
_ANCHOR_HEAD_SCALE = 4.0  # peaked logits: the temperature slope's signal grows with the logprob spread


def _anchor_edit(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    n = len(ANCHOR_VALUES)
    out = dict(state)
    embed = out["model.embed_tokens.weight"].clone()  # [V, E]
    others = embed[:, n:]
    embed[:, n:] = others * (_ANCHOR_OTHERS_SUM_SQUARES / others.pow(2).sum(-1, keepdim=True)).sqrt()
    embed[:, :n] = torch.tensor(ANCHOR_VALUES)
    out["model.embed_tokens.weight"] = embed
    for name, tensor in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):  # [E, in]: rows are residual channels
            written = tensor * _ANCHOR_WRITE_SCALE
            written[:n] = 0.0
            out[name] = written
        elif name.endswith("norm.weight"):
            gained = tensor * _ANCHOR_NORM_GAIN
            gained[:n] = 0.0
            out[name] = gained
        elif name == "lm_head.weight":
            out[name] = tensor * _ANCHOR_HEAD_SCALE
    return _all_exact_in((torch.bfloat16,))(out)


# The long Llama checkpoint's width, with RoPE unscaled at base 1e4 (every frequency kept as it is).
_LLAMA_ARCH: dict[str, Any] = {
    **LLAMA3_ROPE8192.architecture,
    # The long-context workload starts every engine at its max_model_len (8448): an engine that
    # checks it against the config (vLLM) refuses a smaller one. Unscaled RoPE: no value depends on it.
    "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
}
_LLAMA_INIT = SyntheticInit(gain=2.0, embed_std=1.0, norm_jitter=0.1)


def _llama(name: str, stresses: tuple[str, ...], seed: int, edit: WeightEdit) -> EngineCheckpoint:
    return EngineCheckpoint(name, "llama-tiny", stresses, _LLAMA_ARCH, seed, _LLAMA_INIT, edit)


LLAMA3_RMS_ANCHOR = _llama(
    "llama3-numerics-rms-anchor",
    (
        "every RMSNorm's mean square in [1539.5, 1540): just below a bfloat16 rounding midpoint",
        "rsqrt of it (1/39.24) far from a power of two: the canonical rounding stays incoherent",
        "every weight exact in bfloat16",
    ),
    53,
    WeightEdit("rms-anchor", 1, _anchor_edit),
)

# -- RoPE at long query-key distances ---------------------------------------------------------------

LLAMA3_ROPE_LONG = _llama(
    "llama3-numerics-rope-long",
    (
        "RoPE base 1e4, unscaled, no window: a rounded frequency is a phase error growing with distance",
        "prompts of ~1000 positions: the phase error at the far keys reaches 0.18 rad (bf16), 0.16 (fp16)",
        "every weight exact in bfloat16 and float16",
    ),
    54,
    WeightEdit("exact-bf16-fp16", 1, lambda state, config: _all_exact_in(LOW_DTYPES)(state)),
)

# -- attention with a sink: every softmax sum starts at the sink's 1 ------------------------------

# The first token of every prompt (the fixture's BOS) is an attention sink, as in trained models:
# its key alone is nonzero, so every query's score is SINK_SCORE on it and exactly 0 on every other
# key, and each of those keys' exponentials is exp(-SINK_SCORE) ~ 2.5e-4 of the sink's. A softmax
# sum accumulated key by key in the dtype starts at the sink's 1, and each later term, below half an
# ulp of 1 (2^-9 in bfloat16, 2^-11 = 4.9e-4 in float16), rounds away: the sum stays 1 while the true
# one is 1 + t * exp(-SINK_SCORE), so every attention output of query t is (1 + t * 2.5e-4) too
# large, one way at every position and layer. Correct recipes accumulate the sum in float32.
SINK_TOKEN = 433  # llama-tiny's bos_token_id
SINK_CHANNEL, QUERY_CHANNEL = 0, 1  # residual channels: the sink's key source, the queries' constant
SINK_VALUE = 64.0  # the sink row's value in SINK_CHANNEL (0 in every other row)
QUERY_VALUE = 64.0  # every row's value in QUERY_CHANNEL: it dominates each norm's mean square
SINK_KEY_WEIGHT = 1.125  # k_proj's only nonzero entry per KV head (the slot below); q_proj's is 1
SINK_SCORE_RANGE = (7.7, 9.0)  # tested: every query's score on the sink, over the numerics prompts
_SINK_OTHERS_SUM_SQUARES = 64.0  # each embedding row's other channels: sum of squares
_SINK_NORM_GAIN = 8.0  # x / rms(x) is ~1/8 in the other channels: the norm weights restore scale
_SINK_WRITE_SCALE = {"o_proj.weight": 0.25, "down_proj.weight": 0.01}  # the attention path dominates


def sink_slot(head_dim: int) -> int:
    """The head dimension q and k use: the first of the lowest-frequency RoPE pair (rotate-half
    layout pairs d with d + D/2), whose phase moves 1.8e-4 rad per position at base 1e4 and D = 32,
    so the sink's score changes by less than 1e-4 relative over a prompt."""
    return head_dim // 2 - 1


def _sink_edit(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    out = dict(state)
    a, b = SINK_CHANNEL, QUERY_CHANNEL
    embed = out["model.embed_tokens.weight"].clone()  # [V, E]
    others = embed[:, 2:]
    embed[:, 2:] = others * (_SINK_OTHERS_SUM_SQUARES / others.pow(2).sum(-1, keepdim=True)).sqrt()
    embed[:, a] = 0.0
    embed[SINK_TOKEN, a] = SINK_VALUE
    embed[:, b] = QUERY_VALUE
    out["model.embed_tokens.weight"] = embed
    d = config["head_dim"]
    slot = sink_slot(d)
    for name, tensor in state.items():
        if name.endswith("q_proj.weight"):  # [H * D, E]
            q = torch.zeros_like(tensor)
            q[slot::d, b] = 1.0
            out[name] = q
        elif name.endswith("k_proj.weight"):  # [Hkv * D, E]
            k = torch.zeros_like(tensor)
            k[slot::d, a] = SINK_KEY_WEIGHT
            out[name] = k
        elif name.endswith(tuple(_SINK_WRITE_SCALE)):  # [E, in]: rows are residual channels
            written = tensor * _SINK_WRITE_SCALE[name.rsplit(".", 2)[-2] + ".weight"]
            written[:2] = 0.0  # no layer writes the sink's or the queries' channel
            out[name] = written
        elif name.endswith("norm.weight"):
            gained = tensor * _SINK_NORM_GAIN
            # The input norms pass both channels to q/k at weight 1; the others (MLP, final) read neither.
            gained[:2] = 1.0 if name.endswith("input_layernorm.weight") else 0.0
            out[name] = gained
    return _all_exact_in(LOW_DTYPES)(out)


LLAMA3_SOFTMAX_SINK = _llama(
    "llama3-numerics-softmax-sink",
    (
        "every prompt starts with an attention sink: each query scores 7.7 to 9 on it and exactly 0 elsewhere",
        "every other key's exponential is below half an ulp of 1 in bfloat16 and float16",
        "every weight exact in bfloat16 and float16",
    ),
    56,
    WeightEdit("softmax-sink", 1, _sink_edit),
)

# -- Gemma 3 with an inexact sqrt(hidden) --------------------------------------------------------------

GEMMA3_HIDDEN304 = EngineCheckpoint(
    name="gemma3-numerics-hidden304",
    fixture="gemma3-tiny",
    stresses=(
        "hidden size 304: sqrt(304) = 17.4356 is 17.375 in bfloat16 and 17.4375 in float16",
        "post-norm gain 6: the embedding's share of the residual stream is not negligible",
        "every weight exact in bfloat16 and float16",
    ),
    architecture={
        **_GEMMA_ARCH,
        "hidden_size": 304,
        "intermediate_size": 304,
        "num_hidden_layers": 2,
        # Both sliding (window 4096: no prompt reaches it): the layout of the first two layers of
        # the 5-to-1 pattern, which engines that ignore layer_types (llama.cpp) assume anyway.
        "layer_types": ["sliding_attention", "sliding_attention"],
    },
    seed=55,
    # The tied head's logits have std ~ embed_std * sqrt(hidden): 0.2 keeps them at ~3.5 nats as on
    # the hidden-64 checkpoints (0.45 made every position certain: entropy 0, KL 0).
    init=SyntheticInit(gain=1.0, embed_std=0.2, norm_jitter=0.3, post_norm_gain=6.0),
    weight_edit=WeightEdit("exact-bf16-fp16", 1, lambda state, config: _all_exact_in(LOW_DTYPES)(state)),
)

NUMERICS_CHECKPOINTS: tuple[EngineCheckpoint, ...] = (
    GEMMA3_ONE_PLUS_W_BF16,
    GEMMA3_ONE_PLUS_W_FP16,
    LLAMA3_RMS_ANCHOR,
    LLAMA3_ROPE_LONG,
    GEMMA3_HIDDEN304,
    LLAMA3_SOFTMAX_SINK,
)
"""The numerics checkpoints, each written in :data:`NUMERICS_STYLE`."""

# Which low dtypes each checkpoint's design is for (its weights are exact there).
DESIGNED_FOR: dict[str, tuple[str, ...]] = {
    GEMMA3_ONE_PLUS_W_BF16.name: ("bfloat16",),
    GEMMA3_ONE_PLUS_W_FP16.name: ("float16",),
    LLAMA3_RMS_ANCHOR.name: ("bfloat16",),
    LLAMA3_ROPE_LONG.name: ("bfloat16", "float16"),
    GEMMA3_HIDDEN304.name: ("bfloat16", "float16"),
    LLAMA3_SOFTMAX_SINK.name: ("bfloat16", "float16"),
}
