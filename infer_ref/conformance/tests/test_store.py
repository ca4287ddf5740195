"""Cache store through a slot mapping (``store_kvcache``), for any implementation that exposes one.

The oracle is the definition written out in Python: slot ``s`` of a ``[outer, inner, Hkv, D]`` cache
is row ``(s // inner, s % inner)``; ``-1`` writes nothing. Every cache slot starts as a sentinel, so
a write anywhere it should not land (the last slot, for a ``-1`` used as an index) shows bitwise.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from infer_ref.conformance.assertions import assert_equal
from infer_ref.conformance.interface.adapter import Adapter

pytestmark = pytest.mark.ir_requires("store")

SENTINEL = -12345.0


@st.composite
def store_cases(draw: st.DrawFn) -> dict[str, object]:
    """A cache layout, rows to write, and a slot mapping with distinct slots and some -1 entries."""
    outer = draw(st.integers(1, 6))
    inner = draw(st.sampled_from([1, 2, 3, 4, 16]))
    hkv = draw(st.integers(1, 3))
    d = draw(st.sampled_from([2, 4, 8]))
    num_slots = outer * inner
    n = draw(st.integers(1, min(num_slots, 12) + 2))
    live = draw(st.lists(st.integers(0, num_slots - 1), unique=True, min_size=0, max_size=min(n, num_slots)))
    slots = live + [-1] * (n - len(live))
    order = draw(st.permutations(list(range(n))))
    return {
        "outer": outer,
        "inner": inner,
        "hkv": hkv,
        "d": d,
        "slots": [slots[i] for i in order],
        "seed": draw(st.integers(0, 2**16)),
        "layout": draw(st.sampled_from(["paged", "contiguous-view"])),
        "dtype": draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16])),
    }


def _cache(case: dict[str, object]) -> tuple[Tensor, Tensor]:
    """Sentinel-filled K/V caches ``[outer, inner, Hkv, D]``: contiguous (a paged pool) or a permuted
    view of a ``[outer, Hkv, inner, D]`` buffer (how a contiguous cache layer is stored)."""
    outer, inner, hkv, d = (int(case[k]) for k in ("outer", "inner", "hkv", "d"))  # type: ignore[call-overload]
    dtype = case["dtype"]
    assert isinstance(dtype, torch.dtype)
    if case["layout"] == "paged":
        shape = (outer, inner, hkv, d)
        return torch.full(shape, SENTINEL, dtype=dtype), torch.full(shape, SENTINEL, dtype=dtype)
    shape = (outer, hkv, inner, d)
    k = torch.full(shape, SENTINEL, dtype=dtype).permute(0, 2, 1, 3)
    v = torch.full(shape, SENTINEL, dtype=dtype).permute(0, 2, 1, 3)
    return k, v


@given(case=store_cases())
def test_store_writes_exactly_the_mapped_slots(ir_adapter: Adapter, case: dict[str, object]) -> None:
    """Each live slot holds its row bitwise; every other slot, the last one included, keeps the sentinel.

    Guards: *slot -1 used as an index (wraps to the last slot)*, rows written to the wrong slot or
    the wrong half of a strided layout, K and V swapped.
    """
    assert ir_adapter.store_kvcache is not None
    slots = list(case["slots"])  # type: ignore[call-overload]
    k_cache, v_cache = _cache(case)
    dtype = k_cache.dtype
    g = torch.Generator().manual_seed(int(case["seed"]))  # type: ignore[call-overload]
    rows = (len(slots), k_cache.shape[2], k_cache.shape[3])
    k = torch.randn(rows, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(rows, generator=g, dtype=torch.float64).to(dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    inner = k_cache.shape[1]
    for i, s in enumerate(slots):
        if s >= 0:
            expected_k[s // inner, s % inner] = k[i]
            expected_v[s // inner, s % inner] = v[i]
    ir_adapter.store_kvcache(k, v, k_cache, v_cache, torch.tensor(slots, dtype=torch.long))
    params = {k_: v_ for k_, v_ in case.items() if k_ != "dtype"} | {"dtype": str(dtype)}
    assert_equal(k_cache, expected_k, what="K cache after the store (sentinel elsewhere)", params=params)
    assert_equal(v_cache, expected_v, what="V cache after the store (sentinel elsewhere)", params=params)


def test_all_minus_one_writes_nothing(ir_adapter: Adapter) -> None:
    """A mapping of only -1 (every token a prefix-cache hit, or padding) leaves the cache as it was."""
    assert ir_adapter.store_kvcache is not None
    k_cache = torch.full((3, 4, 2, 8), SENTINEL)
    v_cache = torch.full((3, 4, 2, 8), SENTINEL)
    rows = torch.randn(5, 2, 8)
    ir_adapter.store_kvcache(rows, rows, k_cache, v_cache, torch.full((5,), -1, dtype=torch.long))
    assert_equal(k_cache, torch.full_like(k_cache, SENTINEL), what="K cache after an all -1 store")
    assert_equal(v_cache, torch.full_like(v_cache, SENTINEL), what="V cache after an all -1 store")
