"""The switch that lets the decode projections run the Triton matrix-vector kernels.

Why it exists: an eager Triton launch costs tens of microseconds of host time (argument binding,
specialisation lookup), several times what a cuBLAS call costs the host. The eager decode path is
host-bound, so there the projections must keep cuBLAS (``F.linear``). A captured step is different:
replaying a CUDA graph costs no host time per kernel, only device time, and there the kernels'
higher bandwidth is a net win. So the captured fast path turns the kernels on while it warms up
and captures, and everything else leaves them off (the default).

The state is a plain module-level bool, not a ``ContextVar``: ``torch.compile`` guards on module
globals (a change recompiles) while reading a ``ContextVar`` may break the graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_ENABLED = False


def decode_kernels_enabled() -> bool:
    """Whether :func:`infer_ref.fast.kernels.gemv.linear` and ``gated_mlp`` may take their Triton kernels."""
    return _ENABLED


@contextmanager
def decode_kernels(enabled: bool = True) -> Iterator[None]:
    """Turn the decode kernels on (or off) inside the block; the previous state comes back after it.

    Not thread-safe (one global): the captured path warms up and captures on one thread.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {enabled!r}")
    global _ENABLED
    previous = _ENABLED
    _ENABLED = enabled
    try:
        yield
    finally:
        _ENABLED = previous


__all__ = ["decode_kernels", "decode_kernels_enabled"]
