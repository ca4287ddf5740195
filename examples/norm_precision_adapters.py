"""Worked example: two decoders whose RMSNorm rounds differently, and the verdicts they earn.

An implementation may compute RMSNorm as its definition states, or round one step of it to float32
as shipped libraries do. In the float64 tier the kit tells the two apart without failing either:

- ``FLOAT64_NORMS``: every norm wholly in float64, ``w * x / sqrt(mean(x²) + eps)`` written out
  (Gemma: ``x / sqrt(...) * (1 + w)``) — verdict *exact float64*;
- ``LITGPT_NORMS``: litgpt's RMSNorm, ``(x_normed * weight.float()).to(dtype)`` with ``x_normed``
  computed in float32 — verdict *float64 with float32 intermediates*, a precision note per test
  (``--strict-float64`` fails them).

Both are infer_ref's models with their norm modules' ``forward`` replaced on the instance (the rest
of the adapter is infer_ref's own), so the norm is the only difference. Run them from the
repository root::

    infer-ref conformance --impl examples.norm_precision_adapters:FLOAT64_NORMS -k test_model
    infer-ref conformance --impl examples.norm_precision_adapters:LITGPT_NORMS -k test_model --report r.json
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.conformance.interface.adapter import Adapter


def float64_norm(self: Any, x: Tensor) -> Tensor:
    """RMSNorm by its definition in float64 (rounded once to ``x``'s dtype)."""
    x64 = x.double()
    normed = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., E]
    weight = (1.0 + self.weight.double()) if self.unit_offset else self.weight.double()
    return (normed * weight).to(x.dtype)


def litgpt_norm(self: Any, x: Tensor) -> Tensor:
    """litgpt's RMSNorm: normalise in float32, multiply by the float32 weight, round once."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., E]
    weight = (1.0 + self.weight.float()) if self.unit_offset else self.weight.float()
    return (normed * weight).to(x.dtype)


def with_norm(name: str, norm: Callable[[Any, Tensor], Tensor], description: str) -> Adapter:
    """infer_ref's adapter whose models' RMSNorm instances (``unit_offset``: Gemma's) compute ``norm``."""
    assert INFER_REF.load_model is not None
    load = INFER_REF.load_model

    def load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
        model = load(folder, dtype, device)
        for module in model.modules():
            if hasattr(module, "unit_offset") and hasattr(module, "eps"):
                module.forward = types.MethodType(norm, module)
        return model

    return replace(INFER_REF, name=name, version="example", description=description, load_model=load_model)


FLOAT64_NORMS = with_norm("float64-norms", float64_norm, "RMSNorm wholly in float64")
LITGPT_NORMS = with_norm("litgpt-norms", litgpt_norm, "RMSNorm with litgpt's float32 weight multiply")
