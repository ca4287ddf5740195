"""Checks on the tensors a cache is built from, shared by every cache type."""

from __future__ import annotations

from torch import Tensor

from infer_ref.devices import resolve as resolve_device
from infer_ref.memory import overlap

__all__ = ["check_dims", "check_distinct_storage", "check_no_broadcast", "check_storage_pair", "resolve_device"]


def check_distinct_storage(k: Tensor, v: Tensor) -> None:
    """K and V must not overlap in memory: every write of V would overwrite K."""
    if overlap(k, v):
        raise ValueError(
            "k and v overlap in memory (the same tensor or overlapping views): every write of V would "
            "overwrite K; allocate them separately"
        )


def check_no_broadcast(name: str, t: Tensor) -> None:
    """An expanded tensor (stride 0) would make layers or rows alias one storage slice."""
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
        raise ValueError(f"{name} broadcasts one storage slice over several entries (stride 0): allocate it")


def check_storage_pair(k: Tensor, v: Tensor, layout: str) -> None:
    """K and V buffers: same 5-D shape, dtype and device, no broadcast, no overlap."""
    if not isinstance(k, Tensor) or not isinstance(v, Tensor):
        raise TypeError(f"k and v must be tensors, got {type(k).__name__} and {type(v).__name__}")
    if k.dim() != 5 or k.shape != v.shape:
        raise ValueError(f"k and v must both be {layout}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{k.device} and {v.dtype}/{v.device}")
    if not (k.dtype.is_floating_point and v.dtype.is_floating_point):
        raise TypeError(f"k and v must hold floating-point values, got {k.dtype}")
    check_no_broadcast("k", k)
    check_no_broadcast("v", v)
    check_distinct_storage(k, v)


def check_dims(**dims: int) -> None:
    """Every dimension a positive int (bools refused), named in the error."""
    bad = {name: value for name, value in dims.items() if isinstance(value, bool) or not isinstance(value, int) or value <= 0}
    if bad:
        raise ValueError(f"cache dimensions must be positive integers, got {bad}")
