"""Launching the KV store kernel, and the dispatching entry point the caches call."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from infer_ref.fast.kernels.common import HAVE_TRITON, pdl_options
from infer_ref.fast.kernels.store.reference import check_store_args, store_kvcache_reference

if HAVE_TRITON:
    import triton

    from infer_ref.fast.kernels.store.kernel import _store_kvcache_kernel


def store_kvcache_triton(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """The Triton store (CUDA tensors). Host checks only: no sync, no allocation, capturable."""
    check_store_args(k, v, k_cache, v_cache, slot_mapping)
    n, hkv, d = k.shape
    if n == 0:
        return
    args: list[Any] = [k, v, k_cache, v_cache, slot_mapping]
    args += [*k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride()]
    args += [k_cache.shape[1], k_cache.shape[0] * k_cache.shape[1], hkv, d]
    _store_kvcache_kernel[(n,)](
        *args, BLOCK_H=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d), num_warps=4,
        **pdl_options(k.device),
    )  # fmt: skip


def store_kvcache(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """:func:`store_kvcache_reference`'s contract (the dispatching entry point the caches call).

    On CUDA with Triton: the kernel (slot values are not checked, see the module docstring).
    Elsewhere: the reference.
    """
    if HAVE_TRITON and k.is_cuda:
        store_kvcache_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        store_kvcache_reference(k, v, k_cache, v_cache, slot_mapping)


__all__ = ["store_kvcache", "store_kvcache_triton"]
