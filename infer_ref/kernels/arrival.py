"""Arrival counters: how a kernel's last program finds out it is last, so it can combine in place.

A split kernel (flash-decoding attention, a matrix-vector product split over K or followed by a
row norm) leaves partial results that someone must combine. A second kernel would do it, but in a
decode step's chain of dependent launches every launch costs a dependency round trip. Instead each
program stores its partials, passes a block barrier (every thread's stores issued), and increments
a counter with one ``atomic_add(sem="acq_rel", scope="gpu")``: the release publishes its partials,
and the program that reads back ``expected - 1`` is the last one; the acquire lets it see every
other program's partials, which it loads with ``.cg`` (from L2, never a stale L1 line). It
combines them, then stores 0 into its counter so the next launch finds it at zero.

The counters are ``int32`` on the device, zero between launches, allocated once per (kernel
family, device, size) and kept: a CUDA graph captures their address. The first call of a size must
come before a capture (it allocates them), which every caller's warm-up does; a first call inside
a capture is refused. Two launches of one kernel family and size must not run concurrently on
different streams (they share counters); on one stream they are ordered, programmatic dependent
launch included (a kernel's atomics follow its dependency wait, when every earlier kernel is done).
"""

from __future__ import annotations

import torch
from torch import Tensor

_COUNTERS: dict[tuple[str, torch.device, int], Tensor] = {}


def arrival_counters(kernel: str, device: torch.device, size: int) -> Tensor:
    """The ``[size]`` int32 counters of ``kernel`` (a family's name) on ``device``, zero between launches."""
    key = (kernel, device, size)
    if key not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{kernel} needing {size} arrival counter(s) on {device} was first called inside a CUDA graph "
                "capture: call it once before capturing (that call allocates the kernel's arrival counters)"
            )
        _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def counters_in_use() -> dict[tuple[str, torch.device, int], Tensor]:
    """Every counter array allocated so far, by (kernel, device, size): tests check they are back to zero."""
    return dict(_COUNTERS)


def forget_counters(kernel: str, device: torch.device, size: int) -> None:
    """Drop one counter array (tests: the next call allocates it again, as a first call would)."""
    _COUNTERS.pop((kernel, device, size), None)


__all__ = ["arrival_counters", "counters_in_use", "forget_counters"]
