"""The model-level oracle: transformers on the same weights, in float64, through its full (uncached)
forward, with its float32 casts lifted (norms and RoPE tables in float64: ``float64_definition``).
Models are memoised (the last few configs), so a property's examples share one model."""

from __future__ import annotations

import importlib.util
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.oracles.float64_definition import lift_float32_casts

_HF_MODELS: OrderedDict[str, Any] = OrderedDict()
_HF_CACHE_SIZE = 16


def transformers_available() -> bool:
    """Whether transformers is installed, without importing it (a second a process, paid by the
    tests that call the oracle and no other)."""
    return importlib.util.find_spec("transformers") is not None


def transformers_model(hf_config: Mapping[str, Any], state: Mapping[str, Tensor], key: str | None = None) -> Any:
    """A float64 ``AutoModelForCausalLM`` (sdpa attention) with ``state`` loaded and its float32 casts
    lifted (:func:`~infer_ref.conformance.oracles.float64_definition.lift_float32_casts`); memoised by ``key``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    key = key or json.dumps(dict(hf_config), sort_keys=True)
    if key in _HF_MODELS:
        _HF_MODELS.move_to_end(key)
        return _HF_MODELS[key]
    fields = {k: v for k, v in hf_config.items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(hf_config["model_type"], **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
    tied = bool(hf_config.get("tie_word_embeddings"))
    if unexpected or [m for m in missing if not (tied and m == "lm_head.weight")]:
        raise RuntimeError(f"transformers oracle: missing {missing}, unexpected {unexpected}")
    model.eval()
    _HF_MODELS[key] = lift_float32_casts(model, hf_config)
    while len(_HF_MODELS) > _HF_CACHE_SIZE:
        _HF_MODELS.popitem(last=False)
    return model


@torch.inference_mode()
def transformers_logits(
    hf_config: Mapping[str, Any], state: Mapping[str, Tensor], input_ids: Tensor, key: str | None = None
) -> Tensor:
    """Float64 logits ``[B, T, V]`` of transformers' full (uncached) forward."""
    model = transformers_model(hf_config, state, key)
    return model(input_ids.cpu()).logits
