"""The runtime: the runner (with its optional captured step), the scheduler and the one- and
many-request loops. Models know nothing of it.

Sampling (``infer_ref.sampling``) and a request's result (``infer_ref.results``) sit below it; they
are re-exported here. :class:`FastDecoder` (a captured decode step, ``fast_decoder.py``) is loaded
on first use (PEP 562): importing the runtime does not import the fast path's kernels.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from infer_ref.engine.generate import InferModel, generate
from infer_ref.results import GenerationResult, GenerationTiming
from infer_ref.sampling import SamplingParams, sample_token

if TYPE_CHECKING:
    from infer_ref.engine.fast_decoder import FastDecoder

_LAZY = {"FastDecoder": "infer_ref.engine.fast_decoder"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'infer_ref.engine' has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)


__all__ = [
    "FastDecoder",
    "GenerationResult",
    "GenerationTiming",
    "InferModel",
    "SamplingParams",
    "generate",
    "sample_token",
]
