"""Checks on the tensors a cache is built from, shared by every cache type."""

from __future__ import annotations

from torch import Tensor

from infer_ref.devices import resolve as resolve_device

__all__ = ["check_dims", "check_distinct_storage", "check_no_broadcast", "check_storage_pair", "memory_span", "resolve_device"]


def memory_span(t: Tensor) -> tuple[int, int]:
    """Byte addresses ``[lo, hi)`` a tensor can touch (its first and one past its last element)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def check_distinct_storage(k: Tensor, v: Tensor) -> None:
    """K and V must not overlap in memory: every write of V would overwrite K."""
    (k_lo, k_hi), (v_lo, v_hi) = memory_span(k), memory_span(v)
    if k.device.type == "meta":
        return  # no memory behind meta tensors
    if k.device == v.device and k_lo < v_hi and v_lo < k_hi:
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
