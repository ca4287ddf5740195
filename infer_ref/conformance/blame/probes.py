"""The follow-up probes: small model runs, each chosen so that only some bug classes can fail it.

Run after a conformance session whose model-level tests failed, on one fixed small checkpoint per
family (the *probe case*) and on *variants* of it that neutralise one feature each (no sliding
window, every layer sliding, ``query_pre_attn_scalar = head_dim``, no llama3 scaling, unit QK-norm
weights, one layer). Every probe compares logits in float64, so a probe fails only beyond the
float32-intermediates tolerance (a planted bug moves logits by 0.7 or more; rounding by 4e-6 at most):

- against transformers (float64, casts lifted), for the uncached forward of the case or a variant;
- against the implementation's own uncached forward, for cached runs (the cached path must equal it);
- against the implementation's own first position, for a *repeated token*: ``[t, t, ..., t]`` gives
  every position the same logits whatever the attention weights are (each layer averages identical
  value vectors), unless values depend on the position or the cache mixes in foreign entries.

Which classes can fail which probe is :mod:`infer_ref.conformance.blame.signatures`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance import case_models, tiers
from infer_ref.conformance.checkpoints.snapshots import random_state_dict, tiny_config
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.interface.contract import layer_length
from infer_ref.conformance.oracles.transformers_fp64 import transformers_logits

PROBE_SEED = 1234
CAPACITY_SLACK = 3  # unwritten slots after the probes' last position: a cache that attends them shows it


@dataclass(frozen=True)
class Checkpoint:
    """A probe checkpoint: HF config, float32 weights, and a name unique per family and variant."""

    name: str
    hf_config: dict[str, Any]
    state: dict[str, Tensor]

    def crosses_window(self, length: int) -> bool:
        """A sequence of ``length`` runs past the window of some sliding layer."""
        types = self.hf_config.get("layer_types") or []
        return "sliding_attention" in types and int(self.hf_config.get("sliding_window") or 0) < length


@dataclass(frozen=True)
class ProbeResult:
    """One probe's outcome: ``distance`` is :func:`~infer_ref.conformance.tiers.needed_tolerance`."""

    name: str
    family: str
    failed: bool
    distance: float
    windowed: bool  # the probe's checkpoint has a sliding window its sequence crosses
    error: str | None = None  # the implementation refused it (Unsupported): the probe says nothing
    raised: str | None = None  # the implementation raised something else: the probe failed

    def describe(self) -> str:
        if self.error:
            return f"{self.name} [{self.family}]: could not run ({self.error})"
        if self.raised:
            return f"{self.name} [{self.family}]: fails, raising {self.raised}"
        return f"{self.name} [{self.family}]: {'fails' if self.failed else 'passes'} ({self.distance:.1e})"

    @property
    def outcome(self) -> str:
        """For the blame's reasons: 'fails (0.49)', 'fails (raised ValueError)', 'passes (1e-15)'."""
        if self.raised:
            return f"fails (raised {self.raised.split(':')[0]})"
        return f"{'fails' if self.failed else 'passes'} ({self.distance:.1e})"


def probe_case(family: str) -> Checkpoint:
    """The fixed probe checkpoint of ``family``: two or three layers, grouped-query attention; Gemma 3
    with a window of 4 on layers 0 and 2 and ``query_pre_attn_scalar`` 12 != head_dim 16; Llama with
    llama3 scaling whose bands all occur."""
    cfg = copy.deepcopy(tiny_config(family))
    cfg.update(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, tie_word_embeddings=False, eos_token_id=[10_000], max_position_embeddings=256,
               num_hidden_layers=2)  # fmt: skip
    if family == "gemma3_text":
        cfg.update(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   sliding_window=4, query_pre_attn_scalar=12, pad_token_id=0)  # fmt: skip
    if family == "llama":
        cfg["rope_parameters"] = dict(cfg["rope_parameters"], original_max_position_embeddings=16, factor=8.0)
    return Checkpoint(f"probe-{family}", cfg, random_state_dict(cfg, PROBE_SEED))


def probe_length(ckpt: Checkpoint) -> int:
    """Sequence length of the probes: three windows and two past them for Gemma (every sliding layer
    crossed by prefill chunks and decode steps), 12 otherwise."""
    window = ckpt.hf_config.get("sliding_window")
    return 3 * int(window) + 2 if ckpt.hf_config.get("layer_types") and window else 12


# -- variants: one feature neutralised each -------------------------------------------------------


def _renamed(ckpt: Checkpoint, suffix: str, state: dict[str, Tensor] | None = None, **config: Any) -> Checkpoint:
    return Checkpoint(f"{ckpt.name}-{suffix}", {**copy.deepcopy(ckpt.hf_config), **config}, state or ckpt.state)


def without_window(ckpt: Checkpoint) -> Checkpoint:
    """Sliding layers keep their type, with a window longer than any probe sequence."""
    return _renamed(ckpt, "nowindow", sliding_window=256)


def all_sliding(ckpt: Checkpoint) -> Checkpoint:
    """Every layer slides: one layer's window applied to all is then right."""
    return _renamed(ckpt, "allsliding", layer_types=["sliding_attention"] * ckpt.hf_config["num_hidden_layers"])


def scalar_is_head_dim(ckpt: Checkpoint) -> Checkpoint:
    """``query_pre_attn_scalar = head_dim``: the head_dim ** -0.5 scale is then right."""
    return _renamed(ckpt, "qpas", query_pre_attn_scalar=ckpt.hf_config["head_dim"])


def without_llama3_scaling(ckpt: Checkpoint) -> Checkpoint:
    """Plain RoPE: ignoring llama3 scaling is then right."""
    theta = ckpt.hf_config["rope_parameters"]["rope_theta"]
    return _renamed(ckpt, "nollama3", rope_parameters={"rope_type": "default", "rope_theta": theta})


def _qk_norm_weights(ckpt: Checkpoint, new_gain: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """The state with every q_norm / k_norm gain replaced (Gemma stores ``gain - 1``)."""
    gemma = ckpt.hf_config["model_type"] == "gemma3_text"
    state = dict(ckpt.state)
    for name, w in ckpt.state.items():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            gain = new_gain(1.0 + w if gemma else w)
            state[name] = gain - 1.0 if gemma else gain
    return state


def unit_qk_norm(ckpt: Checkpoint) -> Checkpoint:
    """QK-norm gains of 1: RMS normalisation commutes with a rotation, so norm-after-RoPE is then right."""
    return _renamed(ckpt, "unitqk", _qk_norm_weights(ckpt, torch.ones_like))


def doubled_q_norm(ckpt: Checkpoint) -> Checkpoint:
    """QK-norm gains doubled: every logit moves, unless the implementation never applies them."""
    return _renamed(ckpt, "doubledqk", _qk_norm_weights(ckpt, lambda g: 2.0 * g))


def one_layer(ckpt: Checkpoint) -> Checkpoint:
    """Layer 0 alone: nothing can alias or borrow another layer's storage or window."""
    state = {k: v for k, v in ckpt.state.items() if ".layers." not in k or ".layers.0." in k}
    config: dict[str, Any] = {"num_hidden_layers": 1}
    if "layer_types" in ckpt.hf_config:
        config["layer_types"] = ckpt.hf_config["layer_types"][:1]
    return _renamed(ckpt, "onelayer", state, **config)


# -- running the implementation -------------------------------------------------------------------


class Runner:
    """Loads probe checkpoints through the adapter (float64) and runs its forward, cached or not."""

    def __init__(self, adapter: Adapter, device: str) -> None:
        if adapter.load_model is None or adapter.forward is None or adapter.make_model_cache is None:
            raise ValueError(f"{adapter.name} has no model capability (load_model, make_model_cache, forward)")
        self.adapter, self.device = adapter, device
        self._models: dict[str, Any] = {}

    def model(self, ckpt: Checkpoint) -> Any:
        if ckpt.name not in self._models:
            folder = case_models.write_custom_snapshot(ckpt.name, ckpt.hf_config, ckpt.state)
            assert self.adapter.load_model is not None
            self._models[ckpt.name] = self.adapter.load_model(folder, torch.float64, self.device)
        return self._models[ckpt.name]

    def full(self, ckpt: Checkpoint, ids: Tensor) -> Tensor:
        """Uncached logits ``[1, T, V]`` (CPU, float64)."""
        assert self.adapter.forward is not None
        return self.adapter.forward(self.model(ckpt), ids.to(self.device), None).detach().to("cpu", torch.float64)

    def cached(self, ckpt: Checkpoint, ids: Tensor, chunks: list[int]) -> Tensor:
        """Logits ``[1, T, V]`` of ``ids`` fed chunk by chunk through one cache with spare capacity."""
        return self.cached_with_length(ckpt, ids, chunks)[0]

    def cached_with_length(self, ckpt: Checkpoint, ids: Tensor, chunks: list[int]) -> tuple[Tensor, int]:
        """:meth:`cached`, and the cache's length after the last chunk (its contract's reading)."""
        assert self.adapter.forward is not None and self.adapter.make_model_cache is not None
        model = self.model(ckpt)
        cache = self.adapter.make_model_cache(model, ids.shape[1] + CAPACITY_SLACK, 1)
        out, start = [], 0
        for n in chunks:
            out.append(self.adapter.forward(model, ids[:, start : start + n].to(self.device), cache))
            start += n
        length = layer_length(self.adapter.cache_contract, cache, 0)
        return torch.cat(out, dim=1).detach().to("cpu", torch.float64), length


def oracle(ckpt: Checkpoint, ids: Tensor) -> Tensor:
    return transformers_logits(ckpt.hf_config, ckpt.state, ids, key=ckpt.name)


def random_ids(ckpt: Checkpoint, length: int) -> Tensor:
    g = torch.Generator().manual_seed(PROBE_SEED + length)
    return torch.randint(0, ckpt.hf_config["vocab_size"], (1, length), generator=g)  # [1, T]


def decode_chunks(length: int) -> list[int]:
    """Prefill 2 tokens from position 0 (no earlier entry to misalign a mask against), then one at a time."""
    return [2] + [1] * (length - 2)


def chunk_chunks(length: int) -> list[int]:
    """Chunks of 3 over the cache: every chunk after the first has T > 1 and earlier entries."""
    return [3] * (length // 3) + ([length % 3] if length % 3 else [])


def distance(actual: Tensor, expected: Tensor) -> float:
    if tuple(actual.shape) != tuple(expected.shape):
        return float("inf")
    return tiers.needed_tolerance(actual, expected)
