"""Adapters that reproduce the kit's own past blind spots, for the regression tests in this folder.

Each is selected by the tests with ``--ir-impl=kit_adapters:NAME`` (this folder on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache
from infer_ref.conformance.adapters import reference as ref
from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import CacheContract


class CorruptsThenRaises(KVCache):
    """On overflow, writes the part that fits and moves the length, *then* raises a proper ValueError."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        fits = self.max_seq_len - self.seq_len
        if k.dim() == 4 and k.shape[2] > fits:
            self.k[layer_idx, :, :, self.seq_len :] = k[:, :, :fits]
            self.v[layer_idx, :, :, self.seq_len :] = v[:, :, :fits]
            self.position.seq_len = self.max_seq_len
            raise ValueError(f"writing {k.shape[2]} exceeds capacity {self.max_seq_len}")
        return super().update(layer_idx, k, v)


def _corrupting_cache(spec: CacheSpec) -> KVCache:
    cache = ref.make_cache(spec)
    return CorruptsThenRaises(cache.k, cache.v)


CORRUPTS_THEN_RAISES = replace(ref.INFER_REF, name="corrupts-then-raises", make_cache=_corrupting_cache)


class TrustingCache:
    """Positions belong to the caller: no validation at all (writes wherever seq_len says)."""

    def __init__(self, spec: CacheSpec) -> None:
        self.k = torch.zeros(spec.num_layers, spec.batch_size, spec.num_kv_heads, spec.max_seq_len, spec.head_dim, dtype=spec.dtype, device=spec.device)
        self.v = torch.zeros_like(self.k)
        self.seq_len, self.max_seq_len = 0, spec.max_seq_len

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        end = self.seq_len + k.shape[2]
        self.k[layer_idx, :, :, self.seq_len : end] = k
        self.v[layer_idx, :, :, self.seq_len : end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        self.seq_len += n


CALLER_OWNED = Adapter(
    name="caller-owned-positions",
    make_cache=TrustingCache,
    read_cache=lambda c, layer: (c.k[layer, :, :, : c.seq_len], c.v[layer, :, :, : c.seq_len]),
    cache_contract=CacheContract(validates=False),
)


def _slightly_off_forward(model: Any, ids: Tensor, cache: Any) -> Tensor:
    """infer_ref's logits times (1 + 1e-7): like an RMSNorm that casts in another order — off
    transformers by ~1e-7, identical between the cached and the uncached path."""
    return ref.forward(model, ids, cache) * (1 + 1e-7)


SLIGHTLY_OFF = replace(ref.INFER_REF, name="slightly-off-transformers", forward=_slightly_off_forward, generate=None)


# -- a spy: records the device and dtype of every call that takes one --------------------------------

SPY_LOG = Path(os.environ.get("KIT_SPY_LOG", "spy.jsonl"))


def _log(call: str, device: Any, dtype: Any, what: str = "") -> None:
    with SPY_LOG.open("a") as f:
        f.write(json.dumps({"call": call, "device": str(device), "dtype": str(dtype), "what": what}) + "\n")


def _host(device: str) -> str:
    """The spy is asked for ``cpu:0`` (a device string the kit never makes up itself) and runs on the CPU."""
    return "cpu" if device.startswith("cpu") else device


def _spy_make_cache(spec: CacheSpec) -> KVCache:
    _log("make_cache", spec.device, spec.dtype, repr(replace(spec, device="", dtype=None)))  # the drawn geometry
    return ref.make_cache(replace(spec, device=_host(spec.device)))


def _spy_load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    _log("load_model", device, dtype)
    return ref.load_model(folder, dtype, _host(device))


def _spy_make_model_cache(model: Any, max_seq_len: int, batch_size: int) -> Any:
    c = model.config
    _log("make_model_cache", "", "", f"layers {c.num_hidden_layers} head_dim {c.computed_head_dim} positions {max_seq_len} batch {batch_size}")
    assert ref.INFER_REF.make_model_cache is not None
    return ref.INFER_REF.make_model_cache(model, max_seq_len, batch_size)


SPY = replace(
    ref.INFER_REF, name="device-dtype-spy", make_cache=_spy_make_cache, load_model=_spy_load_model,
    make_model_cache=_spy_make_model_cache,
)  # fmt: skip
