"""Which bytes a tensor can touch: the one definition the caches and the kernels use to refuse
K and V buffers that overlap (every write of V would land in K)."""

from __future__ import annotations

from torch import Tensor


def memory_span(t: Tensor) -> tuple[int, int]:
    """Byte addresses ``[lo, hi)`` a (possibly strided, even negatively) tensor can touch."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    forward = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True) if stride > 0)
    backward = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True) if stride < 0)
    itemsize = t.element_size()
    return t.data_ptr() + backward * itemsize, t.data_ptr() + (forward + 1) * itemsize


def overlap(a: Tensor, b: Tensor) -> bool:
    """True when ``a`` and ``b`` live on one device and their byte ranges intersect (never on ``meta``)."""
    if a.device != b.device or a.device.type == "meta":
        return False
    (a_lo, a_hi), (b_lo, b_hi) = memory_span(a), memory_span(b)
    return a_lo < b_hi and b_lo < a_hi
