"""The fast decode path, fenced off from the reference: kernel-backed modules swapped into a model,
the fused decode step, the decode-kernel switch and :class:`FastDecoder` (a captured decode step).

The reference (``infer_ref.models``, ``infer_ref.attention``, ``infer_ref.cache``) imports nothing
from here; this package imports the reference and the kernels. :func:`use_fast_modules` swaps the
kernel-backed classes into a model (``modules.py`` says how and why that keeps it correct for every
other caller); a :class:`FastDecoder` does it when it is built, and the runtime does it for models
on CUDA.

Names are loaded on first use (PEP 562), so ``infer_ref.fast.kernels`` can import the switch without
pulling in the decoder, which imports the kernels.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "FastDecoder": "infer_ref.fast.decoder",
    "generate_fast": "infer_ref.fast.decoder",
    "sliced_argmax": "infer_ref.fast.decoder",
    "use_fast_modules": "infer_ref.fast.modules",
    "decode_kernels": "infer_ref.fast.switch",
    "decode_kernels_enabled": "infer_ref.fast.switch",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'infer_ref.fast' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


__all__ = sorted(_EXPORTS)
