"""The Triton kernel of the KV store: one program per token writes its [Hkv, D] rows of K and V."""

from __future__ import annotations

from infer_ref.fast.kernels.common import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from infer_ref.fast.kernels.common import pdl_prologue

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
