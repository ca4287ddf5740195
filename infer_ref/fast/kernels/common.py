"""What every kernel family shares: Triton's presence, programmatic dependent launch, the device a
launch is tuned for, and the memory checks of the host side.

**Programmatic dependent launch (PDL): let the next kernel start while this one drains.**

A decode step is a chain of ~200 short kernels; between two of them the GPU drains the first
grid, then launches and ramps up the second. On Hopper (compute capability 9.0) and later a kernel
launched with PDL may be scheduled before its predecessor finishes: it runs up to
``griddepcontrol.wait``, which blocks until the predecessor has completed and its writes are
visible. Measured on an H100 inside a CUDA graph: a chain of tiny kernels costs 0.64 us per kernel
with PDL against 0.93 us without, and a chain of 2048x2048 matrix-vector products 4.8 us against
5.4 us (``benchmarks/log/DECODE_LOG.md``).

The rule every kernel here follows when its ``USE_PDL`` constexpr is set (see :func:`pdl_prologue`):
call ``gdc_wait`` before the first load of anything an earlier kernel may write and before the
first store (a store before it could overwrite what the predecessor still reads), then
``gdc_launch_dependents`` so the successor may be scheduled. Loads of constant data (weights) may
come before the wait. So may loads of data that only kernels before the predecessor wrote: when
a kernel starts, its predecessor has passed its own wait (or, without PDL, finished), so every
earlier kernel has completed and its writes are visible; only the predecessor's writes may still
be in flight. A kernel that reads before the wait through an index the predecessor may be writing
(the decode attention's lengths and block table) treats what it read as a hint: it reads the
index again after the wait and redoes what it read through a stale one. A kernel without PDL is ordered as usual, so kernels from anywhere else
(cuBLAS, Inductor) mix freely with these in one stream or graph.

:func:`pdl_launch` says whether a launch on ``device`` uses PDL; ``INFER_REF_PDL=0`` turns it off
(for A/B timings, or a driver that mishandles it).

**The device a launch is tuned for.** The tuning tables of the families (``gemv/tuning.py``,
``attention/tuning.py``) are keyed by (device, shape): :func:`device_profile` names a CUDA device by
its compute capability and asks it for its SM count (cached per device). Under the Triton
interpreter (CPU tensors) there is no device to ask: launches are planned for
:data:`INTERPRETED_AS`, the sm_90 device with 132 SMs the tables were measured on, so the
interpreter runs (and the sm_90 ahead-of-time compile checks compile) the configurations an H100
launches.

**Memory.** :func:`overlap` (``infer_ref.memory``, shared with the caches) and :func:`same_view`:
what the host checks use to refuse an output that aliases an input.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch
from torch import Tensor

from infer_ref.memory import overlap

try:  # Triton is optional: absent on CPU-only installs.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False
try:  # grid-dependency control came with Triton 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_GDC = False

ENV_SWITCH = "INFER_REF_PDL"
# The activation dtypes every kernel here takes; other dtypes take the torch reference.
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def pdl_launch(device: torch.device) -> bool:
    """Whether kernels launched on ``device`` use PDL: a CUDA device of compute capability 9.0 or
    later, a Triton with grid-dependency control, and ``INFER_REF_PDL`` not ``0``. Never under the
    Triton interpreter (it has no ``griddepcontrol``)."""
    if not HAVE_GDC or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    return device_profile(device).capability >= (9, 0)


def pdl_options(device: torch.device) -> dict[str, Any]:
    """Launch keywords for a kernel taking the ``USE_PDL`` constexpr: ``USE_PDL``, and Triton's
    ``launch_pdl`` where PDL is on (never passed otherwise: the interpreter does not know it)."""
    use = pdl_launch(device)
    return {"USE_PDL": True, "launch_pdl": True} if use else {"USE_PDL": False}


if HAVE_GDC:

    @triton.jit
    def pdl_prologue(USE_PDL: tl.constexpr):  # type: ignore[no-untyped-def]  # Triton reads the signature
        # Wait for the predecessor's writes, then let the successor be scheduled (module docstring).
        if USE_PDL:
            gdc_wait()
            gdc_launch_dependents()

elif HAVE_TRITON:  # pragma: no cover - an older Triton: pdl_launch() is always False there

    @triton.jit
    def pdl_prologue(USE_PDL: tl.constexpr):  # type: ignore[no-untyped-def]
        pass


# -- the device a launch is planned for ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What a launch plan asks of its device: ``capability`` (major, minor), the key of the tuning
    tables (the architecture the entries were measured on), and ``sm_count``, the streaming
    multiprocessors the heuristics fill."""

    capability: tuple[int, int]
    sm_count: int


# The interpreter's stand-in: the H100 (sm_90, 132 SMs) the tables were measured on (module docstring).
INTERPRETED_AS = DeviceProfile(capability=(9, 0), sm_count=132)


@functools.cache
def _cuda_profile(device_index: int) -> DeviceProfile:
    props = torch.cuda.get_device_properties(device_index)
    return DeviceProfile(capability=(props.major, props.minor), sm_count=int(props.multi_processor_count))


def device_profile(device: torch.device) -> DeviceProfile:
    """The :class:`DeviceProfile` of ``device``: asked of the CUDA device once (cached); any other
    device (the interpreter's CPU tensors) gets :data:`INTERPRETED_AS`."""
    if device.type != "cuda":
        return INTERPRETED_AS
    return _cuda_profile(device.index if device.index is not None else torch.cuda.current_device())


# -- memory ----------------------------------------------------------------------------------------


def same_view(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` address the same elements in the same order (one tensor, or two equal views)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
    )


__all__ = [
    "ENV_SWITCH",
    "HAVE_GDC",
    "HAVE_TRITON",
    "INTERPRETED_AS",
    "KERNEL_DTYPES",
    "DeviceProfile",
    "device_profile",
    "overlap",
    "pdl_launch",
    "pdl_options",
    "same_view",
]
