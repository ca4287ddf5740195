"""The float64 tier's three verdicts and the two tolerances between them.

An implementation judged in float64 reaches one of:

- **exact float64**: every logit within ``EXACT_FLOAT64`` of the float64 oracle (rtol = atol);
  implementations that compute every step in float64 differ by reduction order only;
- **float64 with float32 intermediates**: within ``FLOAT32_INTERMEDIATES`` — the rounding of a norm,
  its weight multiply, the RoPE angles or the softmax held in float32, as transformers and litgpt do.
  Reported as a precision note, not a failure, unless ``--strict-float64`` is given;
- **wrong**: beyond it, where every planted bug lies.

Both tolerances are measured (docs/conformance.md, "Float64 tolerances";
``python -m infer_ref.conformance.precision_spread``, its record ``benchmarks/log/precision_spread.json``), and
``tests/kit/test_float64_tolerances.py`` checks that the measured spreads sit inside them and the
planted bugs outside. The distance is :func:`needed_tolerance`, the one ``assert_close`` tests.
"""

from __future__ import annotations

import torch
from torch import Tensor

EXACT_FLOAT64 = 1e-9
"""Correct float64 computations differ by reduction order: the control copy's row of
``python -m infer_ref.conformance.precision_spread --mutants`` (infer_ref vs the float64 oracle on the
kit's checkpoints; docs/conformance.md, "Float64 tolerances") is orders of magnitude below; 1e-9
leaves room for longer sums and other kernels."""

FLOAT32_INTERMEDIATES = 1e-4
"""Above how far float32 steps inside a float64 model move logits on the kit's checkpoints, below
the nearest planted bug, both by wide margins: the same command's variant and bug rows (the margins
are in docs/conformance.md, "Float64 tolerances"; ``tests/kit/test_float64_tolerances.py`` checks them)."""

EXACT, FLOAT32_STEPS, WRONG = "exact float64", "float64 with float32 intermediates", "wrong"
VERDICTS = (EXACT, FLOAT32_STEPS, WRONG)

PRECISION_NOTES: list[str] = []
"""One entry per float64 comparison that reached the middle tier (the plugin attaches them to the test)."""

_STRICT: dict[str, bool] = {"strict": False}


def set_strict_float64(strict: bool) -> None:
    """``--strict-float64``: the middle tier fails instead of being noted."""
    _STRICT["strict"] = strict


def strict_float64() -> bool:
    return _STRICT["strict"]


def needed_tolerance(actual: Tensor, expected: Tensor) -> float:
    """The smallest ``t`` with ``|actual - expected| <= t * (1 + |expected|)`` everywhere (NaN: inf)."""
    a, e = actual.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    ratio = (a - e).abs() / (1.0 + e.abs())  # [...]
    ratio = torch.where(a.isnan() | e.isnan(), torch.full_like(ratio, float("inf")), ratio)
    return float(ratio.max()) if ratio.numel() else 0.0


def float64_verdict(distance: float, exact: float = EXACT_FLOAT64) -> str:
    """The tier a float64 comparison at ``distance`` (:func:`needed_tolerance`) reaches."""
    if distance <= exact:
        return EXACT
    return FLOAT32_STEPS if distance <= FLOAT32_INTERMEDIATES else WRONG


__all__ = [
    "EXACT",
    "EXACT_FLOAT64",
    "FLOAT32_INTERMEDIATES",
    "FLOAT32_STEPS",
    "PRECISION_NOTES",
    "VERDICTS",
    "WRONG",
    "float64_verdict",
    "needed_tolerance",
    "set_strict_float64",
    "strict_float64",
]
