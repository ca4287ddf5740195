"""Cache store: write K/V rows into a cache through a slot mapping.

A cache here is any 4-D tensor ``[outer, inner, Hkv, D]`` with arbitrary strides; slot ``s`` is row
``(s // inner, s % inner)``. Two layouts use it:

- the paged pool of one layer, ``[num_blocks, block_size, Hkv, D]``: slot
  ``block_table[pos // bs] * bs + pos % bs``;
- the contiguous cache of one layer, ``[B, Hkv, S, D]`` seen as ``[B, S, Hkv, D]`` (a permuted view,
  no copy): slot ``b * S + pos``.

A slot of ``-1`` writes nothing (a prefix-cache hit, a padding row). It must never be used as an
index: Python and torch read ``-1`` as "the last slot", which silently overwrites a live entry.

:func:`store_kvcache_reference` is the definition; :func:`store_kvcache` runs the Triton kernel on
CUDA when Triton is importable and the reference everywhere else. Both check shapes, dtypes, devices
and aliasing on the host from metadata alone; only the reference also checks slot *values* (range,
duplicates), because reading them on the host would synchronise with the device. The kernel never
writes outside the cache: a slot outside ``[0, outer * inner)`` writes nothing there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from infer_ref.kernels.pdl import pdl_options
from infer_ref.memory import overlap

try:  # Triton is optional: absent on CPU-only installs, where the reference serves every call.
    import triton
    import triton.language as tl

    from infer_ref.kernels.pdl import pdl_prologue

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


def check_store_args(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Shapes, dtypes, devices and aliasing (host metadata only: no device synchronisation)."""
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [num_tokens, num_kv_heads, head_dim], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [outer, inner, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"entries are [*, {k.shape[1]}, {k.shape[2]}] but the cache holds [*, *, {k_cache.shape[2]}, {k_cache.shape[3]}]")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [num_tokens={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != k.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, k has {k.dtype}: the store never converts")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("slot_mapping", slot_mapping)):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device}, k is on {k.device}")
    # Addresses are not traceable: under torch.compile the check is left to eager calls (caches check
    # their buffers when they are built; a traced step only ever stores into those).
    if not torch.compiler.is_compiling() and overlap(k_cache, v_cache):
        raise ValueError("k_cache and v_cache share memory: a V write would overwrite K (or the reverse)")


def store_kvcache_reference(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write ``k[i]``/``v[i]`` ``[Hkv, D]`` at slot ``slot_mapping[i]``; ``-1`` writes nothing.

    Args:
        k, v: ``[N, Hkv, D]`` rows to store.
        k_cache, v_cache: ``[outer, inner, Hkv, D]``, written in place (views write through).
        slot_mapping: ``[N]`` integer slots in ``[0, outer * inner)`` or ``-1``; distinct.
    """
    check_store_args(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.long()
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    bad = (slots < -1) | (slots >= num_slots)
    if bool(bad.any()):
        raise IndexError(
            f"slot_mapping holds {slots[bad].tolist()[:8]}: slots must be in [0, {num_slots}) or -1 (skip)"
        )
    keep = slots >= 0  # -1 is "skip", never an index
    live = slots[keep]
    if live.numel() != live.unique().numel():
        raise ValueError("slot_mapping writes one slot twice: the result would depend on write order")
    inner = k_cache.shape[1]
    outer_idx, inner_idx = live // inner, live % inner
    k_cache[outer_idx, inner_idx] = k[keep]  # index_put_ through the (possibly strided) view
    v_cache[outer_idx, inner_idx] = v[keep]


if HAVE_TRITON:

    @triton.jit
    def _store_kvcache_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        stride_kn, stride_kh, stride_kd,  # k  [N, Hkv, D]
        stride_vn, stride_vh, stride_vd,  # v  [N, Hkv, D]
        stride_ko, stride_ki, stride_kch, stride_kcd,  # k_cache [outer, inner, Hkv, D]
        stride_vo, stride_vi, stride_vch, stride_vcd,  # v_cache [outer, inner, Hkv, D]
        inner, num_slots, num_kv_heads, head_dim,
        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # One program per token: its [Hkv, D] rows of K and V. All address arithmetic is int64:
        # slot * stride overflows int32 for pools past 2**31 elements.
        pdl_prologue(USE_PDL)  # k, v and the slots come from earlier kernels
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        if (slot >= 0) & (slot < num_slots):  # -1 (skip) and out-of-range slots write nothing
            outer = slot // inner
            row = slot % inner
            h = tl.arange(0, BLOCK_H).to(tl.int64)[:, None]  # [BLOCK_H, 1]
            d = tl.arange(0, BLOCK_D).to(tl.int64)[None, :]  # [1, BLOCK_D]
            mask = (h < num_kv_heads) & (d < head_dim)
            k = tl.load(k_ptr + token * stride_kn + h * stride_kh + d * stride_kd, mask=mask)
            v = tl.load(v_ptr + token * stride_vn + h * stride_vh + d * stride_vd, mask=mask)
            k_dst = k_cache_ptr + outer * stride_ko + row * stride_ki + h * stride_kch + d * stride_kcd
            v_dst = v_cache_ptr + outer * stride_vo + row * stride_vi + h * stride_vch + d * stride_vcd
            tl.store(k_dst, k, mask=mask)
            tl.store(v_dst, v, mask=mask)


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
