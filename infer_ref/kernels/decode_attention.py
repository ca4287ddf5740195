"""Fused decode attention: one kernel from the projected q/k/v of one new token to its attention output.

Between a decode step's qkv projection and its output projection a layer used to run a chain of
small kernels: the per-head q/k RMSNorms (Qwen3, Gemma 3), RoPE, copies, the K/V store, the split
attention kernel and its combine kernel. Here all of it is one launch.

The definition (:func:`decode_attention_reference`, written with the torch definitions the models
use): ``q, k = q_norm(q), k_norm(k)`` per head when given (``infer_ref.norm``); ``q, k``
rotated by ``apply_rope`` (``infer_ref.rotary``) with the new token's cos/sin rows; ``k``
(normed and rotated) and ``v`` (raw: V is never normed or rotated) written into the layer's pool
at position ``seq_lens[b] - 1`` of row ``b``, slot ``table[b, p // bs] * bs + p % bs``; then
:func:`~infer_ref.kernels.paged_attention.paged_decode_attention_reference` of the rotated query
over positions ``[0, seq_lens[b])`` (a sliding layer: its window).

The kernel (flash-decoding, grid ``(B * head blocks, NUM_SPLITS)``; a head block is the GROUP query
heads of one KV head, or ``heads_per_program`` of them):

- a program taking a whole group runs its two products (``q k^T``, ``p v``) on tensor cores, the
  query block padded to tl.dot's 16 rows; one taking a part of a group runs them as float32
  multiply-and-sums without padding, and reads its KV head's keys itself (the other programs of
  the group read the same ones, mostly from L2). Gemma-3-1b's 4 heads of 256 take a program each:
  padded to 16 rows, they held ~220 registers a thread (:data:`TILES_BY_HEAD_DIM`);
- every program loads its query heads and normalises and rotates them in
  registers, reproducing eager torch's roundings in the activation dtype (the norm per
  ``norm.py``; RoPE as ``round(round(x * cos) + round(rotate_half(x) * sin))``, each product of two
  bf16/fp16 numbers exact in float32, so the rotation is bit-exact; float32 launches turn off
  multiply-add contraction, which would round ``x * cos + r * sin`` once instead of three times).
  ``rotate_half`` pairs element ``e`` with ``e ± D/2``: the kernel loads those partners too and
  normalises them with the same per-head ``rstd``, so no register shuffles are needed;
- it also prepares the new token's key (k_norm, RoPE) and takes its value as is. The program whose
  split holds position ``n - 1`` (the last non-empty split, the "owner"), of its KV head's first
  head block, stores both into the pool slot, after its attention loop; attention never reads that slot back: in the tile holding
  ``n - 1`` the registers replace the (masked, unread) row, so no program depends on another's
  store (no read-after-write hazard inside the launch);
- each program runs an online softmax in float32 over its share of the visible keys (a first
  tile of ``first_n`` keys, then tiles of ``block_n``; ``NUM_SPLITS`` fixed on the host from
  shapes, each program reading ``seq_lens`` on the device and returning at once when its split is
  empty); table entries past ``ceil(n / bs)`` and slots outside ``[n - window, n)`` are never read;
- the combine happens in the same launch: each non-empty split writes float32 partials (output,
  max, sum) and increments a per-``(row, head block)`` arrival counter (one atomic, acq_rel at gpu
  scope, after a barrier so every thread's partial stores are ordered before it); the program that
  arrives last combines the partials in split order (the same arithmetic whoever is last:
  deterministic), writes ``[B, H, D]`` and resets the counter to zero for the next launch. Partials
  are loaded with ``.cg`` (L2, not a possibly stale L1 line). A row whose visible keys fit in one
  split, and every launch with ``NUM_SPLITS == 1``, skips partials and counter entirely.

The preload (``preload=True``; the decode steps of ``infer_ref/fast/decode_step.py`` launch
with it). With programmatic dependent launch (``infer_ref/kernels/pdl.py``) the kernel may start
while the one before it (the layer's qkv projection) still runs; until its dependency wait only
data no earlier kernel is still writing may be read. The bulk of the kernel's reads, the cached
K/V of positions before ``n - 1``, is such data in a model's step: only this kernel writes them,
one step earlier. So each split reads its first tile (``first_n`` keys, :class:`Tile`) before the
wait, through the lengths and the block table as they read then, clamped into the table and the
pool (an unwritten or stale value only reads somewhere harmless). After the wait it reads the
length and those table entries again with q/k/v (no extra round trip); if either changed (the
kernel before was writing them), the tile is read again. A split's first tile is also its
fewest keys, so short rows are one preloaded tile per split; the loop takes ``block_n`` keys at a
time after it. Measured on an H100 (one run, a chain of 16 layers): Llama-3.2-1B's attention at
128 positions 4.90 us a layer against 5.38 without the preload, at 4096 15.93 against 19.31.

The counters (``[B * head blocks]`` int32, zero between launches) are allocated once per (device, size)
and kept, so a CUDA graph captures their address; the first call of a shape must come before a
capture (it allocates them), which is what every caller's warm-up does. Two launches of the same
``B * head blocks`` on one device must not run concurrently on different streams (they share counters).

With the prep stages switched off by constexprs (no norm, no RoPE, no new K/V) the same kernel
serves :func:`~infer_ref.kernels.paged_attention.paged_decode_attention`: there is one decode
attention kernel in the codebase.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from infer_ref.kernels.paged_attention import (
    _sm_count,
    check_decode_args,
    decode_num_splits,
    paged_decode_attention_reference,
    slots_through_tables,
)
from infer_ref.kernels.pdl import pdl_options
from infer_ref.kernels.store import store_kvcache_reference
from infer_ref.memory import overlap
from infer_ref.norm import NormSpec
from infer_ref.rotary import apply_rope

try:  # Triton is optional: absent on CPU-only installs, where the reference serves every call.
    import triton
    import triton.language as tl

    from infer_ref.kernels.pdl import pdl_prologue

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The NORM constexpr: which RMSNorm formula (infer_ref/norm.py), or none.
NORM_NONE, NORM_LLAMA, NORM_GEMMA = 0, 1, 2


# -- the definition --------------------------------------------------------------------------------


def _norm_code(spec: NormSpec | None) -> int:
    if spec is None:
        return NORM_NONE
    return NORM_GEMMA if spec.unit_offset else NORM_LLAMA


def check_decode_attention_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor | None,
    sin: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
    q_norm: NormSpec | None = None,
    k_norm: NormSpec | None = None,
) -> None:
    """Shapes, dtypes, devices, scalars and aliasing (host metadata only: no device synchronisation).

    Each error names the argument, what it was and what was expected; nothing is written before
    the checks pass.
    """
    tensors = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables, "seq_lens": seq_lens}
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be floating-point (the activation dtype), got {q.dtype}")
    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    b, _, d = q.shape
    hkv = k_cache.shape[2]
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [batch, num_kv_heads, head_dim], got {tuple(k.shape)} and {tuple(v.shape)}")
    if tuple(k.shape) != (b, hkv, d):
        raise ValueError(
            f"k and v must be [batch={b}, num_kv_heads={hkv}, head_dim={d}] (q's batch and head_dim, the cache's "
            f"num_kv_heads), got {tuple(k.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: the new token's q, k, v share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must both be given (RoPE) or both be None (no RoPE)")
    if cos is not None and sin is not None:
        for name, t in (("cos", cos), ("sin", sin)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a tensor or None, got {type(t).__name__}")
            if t.dim() != 2 or t.shape[0] not in (1, b) or t.shape[1] != d:
                raise ValueError(f"{name} must be [batch={b}, head_dim={d}] or [1, head_dim={d}] (one row for every row), got {tuple(t.shape)}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: RoPE runs in the activation dtype")
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
        if cos.shape != sin.shape:
            raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
        if d % 2:
            raise ValueError(f"RoPE needs an even head_dim (rotate_half splits it in halves), got {d}")
    for name, spec in (("q_norm", q_norm), ("k_norm", k_norm)):
        if spec is None:
            continue
        if not isinstance(spec, NormSpec):
            raise TypeError(f"{name} must be an infer_ref.norm.NormSpec or None, got {type(spec).__name__}")
        if tuple(spec.weight.shape) != (d,):
            raise ValueError(f"{name}.weight must be [head_dim={d}] (a per-head norm), got {tuple(spec.weight.shape)}")
        if spec.weight.dtype != q.dtype:
            raise TypeError(f"{name}.weight has dtype {spec.weight.dtype}, q has {q.dtype}: the norm runs in the activation dtype")
        if spec.weight.device != q.device:
            raise ValueError(f"{name}.weight is on {spec.weight.device}, q is on {q.device}")
    # Addresses are not traceable: under torch.compile the check is left to eager calls.
    if not torch.compiler.is_compiling() and overlap(k_cache, v_cache):
        raise ValueError("k_cache and v_cache share memory: a V write would overwrite K (or the reverse)")


def _check_values(k_cache: Tensor, block_tables: Tensor, seq_lens: Tensor) -> None:
    """The reference's value checks (it may synchronise): lengths in ``[1, M * bs]`` and every table
    entry it reads (``c < ceil(n / bs)``) a block of the pool, before anything is written."""
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    capacity = block_tables.shape[1] * block_size
    lens = seq_lens.long().cpu()
    bad = (lens < 1) | (lens > capacity)
    if bool(bad.any()):
        raise ValueError(
            f"seq_lens holds {lens[bad].tolist()[:8]}: each must be in [1, {capacity}] (the new token's position + 1, "
            f"within block_tables' {block_tables.shape[1]} blocks of {block_size})"
        )
    tables = block_tables.long().cpu()
    for row, n in enumerate(lens.tolist()):
        used = tables[row, : -(-n // block_size)]
        wrong = (used < 0) | (used >= num_blocks)
        if bool(wrong.any()):
            raise IndexError(f"block_tables[{row}] holds {used[wrong].tolist()[:8]} among its first {used.numel()} entries: block ids must be in [0, {num_blocks})")


def decode_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor | None,
    sin: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
    q_norm: NormSpec | None = None,
    k_norm: NormSpec | None = None,
) -> Tensor:
    """One decode step of one layer, by the torch definitions: ``[B, H, D]`` in q's dtype.

    Args:
        q: ``[B, H, D]``, the new token's query before the per-head norm and RoPE (any strides).
        k, v: ``[B, Hkv, D]``, its key (before k_norm and RoPE) and value (stored as is).
        cos, sin: ``[B, D]`` (per row) or ``[1, D]`` (shared): the RoPE tables of the new token's
            position, in the activation dtype; both None: no RoPE.
        k_cache, v_cache: one layer's pool ``[num_blocks, block_size, Hkv, D]`` (possibly a strided
            view, :func:`~infer_ref.kernels.paged_attention.contiguous_layer_as_paged`); the new
            K/V are written in place at position ``seq_lens[b] - 1`` through the block table.
        block_tables: ``[B, M]`` int32/int64 block ids.
        seq_lens: ``[B]`` int32/int64, the length of each row after this token (``>= 1``).
        scale: softmax scale.
        window: sliding window (key ``j`` visible to the query at ``p`` iff ``p - window < j <= p``)
            or None.
        q_norm, k_norm: per-head RMSNorms (weight ``[D]``) applied before RoPE, or None.

    Query head ``h`` reads KV head ``h // (H / Hkv)``. Values are checked (this synchronises).
    """
    check_decode_attention_args(q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window, q_norm, k_norm)
    _check_values(k_cache, block_tables, seq_lens)
    q4, k4 = q[:, :, None], k[:, :, None]  # [B, H, 1, D], [B, Hkv, 1, D]: one token
    if q_norm is not None:
        q4 = q_norm(q4)
    if k_norm is not None:
        k4 = k_norm(k4)
    if cos is not None and sin is not None:
        # [1, D] is apply_rope's [T=1, D] (shared by every row); [B, D] becomes [B, T=1, D] (per row).
        c, s = (cos, sin) if cos.shape[0] == 1 else (cos[:, None], sin[:, None])
        q4, k4 = apply_rope(q4, c, s), apply_rope(k4, c, s)
    slots = slots_through_tables(block_tables, (seq_lens.long() - 1)[:, None], k_cache.shape[1]).reshape(-1)  # [B]
    store_kvcache_reference(k4[:, :, 0], v, k_cache, v_cache, slots)
    return paged_decode_attention_reference(q4[:, :, 0], k_cache, v_cache, block_tables, seq_lens, scale, window)


# -- the kernel ------------------------------------------------------------------------------------

if HAVE_TRITON:

    @triton.jit
    def _rstd(x, eps, HEAD_DIM: tl.constexpr):  # type: ignore[no-untyped-def]  # Triton reads the signature
        # rsqrt(mean(x32^2) + eps) per head (row) of x [R, DIM_PAD] (padding holds zeros): [R], with
        # IEEE square root and division (within two roundings; rsqrt.approx is not correctly rounded).
        x32 = x.to(tl.float32)
        return 1.0 / tl.sqrt_rn(tl.sum(x32 * x32, axis=1) / HEAD_DIM + eps)

    @triton.jit
    def _normed(x, w, rstd, NORM: tl.constexpr):  # type: ignore[no-untyped-def]
        # x [R, DIM_PAD] in the activation dtype, w [DIM_PAD] (its elements matching x's columns),
        # rstd [R]; the roundings of infer_ref/norm.py.
        x32 = x.to(tl.float32)
        w32 = w.to(tl.float32)[None, :]
        if NORM == 1:  # Llama/Qwen: w * round(x32 * rstd), rounded again
            y = (w32 * (x32 * rstd[:, None]).to(x.dtype).to(tl.float32)).to(x.dtype)
        else:  # Gemma: x32 * rstd * (1 + w32) in float32, rounded once
            y = (x32 * rstd[:, None] * (1.0 + w32)).to(x.dtype)
        return y

    @triton.jit
    def _rotated(x, partner, cos, sin, first_half):  # type: ignore[no-untyped-def]
        # round(round(x * cos) + round(rotate_half(x) * sin)); rotate_half(x)[e] is -x[e + D/2] in
        # the first half, x[e - D/2] in the second: ``partner`` holds x[e ± D/2].
        rot = tl.where(first_half[None, :], -partner, partner)
        a = (x.to(tl.float32) * cos.to(tl.float32)[None, :]).to(x.dtype)
        b = (rot.to(tl.float32) * sin.to(tl.float32)[None, :]).to(x.dtype)
        return (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)

    @triton.jit
    def _prep_heads(x, partner, w, w_partner, eps, cos, sin, first_half, HEAD_DIM: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
        # Per-head norm (the partners with the same rstd: a permutation of the row would sum in
        # another order), then RoPE.
        if NORM != 0:
            rstd = _rstd(x, eps, HEAD_DIM)
            if ROPE:
                partner = _normed(partner, w_partner, rstd, NORM)
            x = _normed(x, w, rstd, NORM)
        if ROPE:
            x = _rotated(x, partner, cos, sin, first_half)
        return x

    @triton.jit
    def _split_bounds(n, split, window, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, FIRST_N: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
        # Visible keys [first, n): the window's keys only, never a masked full scan. The splits share
        # them in chunks of whole tiles, at least FIRST_N keys each (the first tile's size); the last
        # non-empty split (the owner) holds n - 1. -> (used splits, owner, this split's [start, end)).
        first = tl.where(window > 0, tl.maximum(n - window, 0), 0)
        chunk = tl.maximum(tl.cdiv(tl.cdiv(n - first, NUM_SPLITS), BLOCK_N) * BLOCK_N, FIRST_N)
        used = tl.maximum(tl.cdiv(n - first, chunk), 1)  # non-empty splits (1 for a length-0 row)
        owner = (n - 1 - first) // chunk
        start = first + split * chunk
        return used, owner, start, tl.minimum(start + chunk, n)

    @triton.jit
    def _tile_blocks(table_row, pos, live, block_size, stride_tm):  # type: ignore[no-untyped-def]
        # Block ids [N] (int64) of positions pos; entries past the live keys are never loaded
        # (masked): stale table entries cannot matter.
        return tl.load(table_row + (pos // block_size) * stride_tm, mask=live, other=0).to(tl.int64)

    @triton.jit
    def _load_tile(  # type: ignore[no-untyped-def]
        k_head, v_head, block, pos, read, block_size, e, e_ok,
        stride_kb, stride_ko, stride_kd, stride_vb, stride_vo, stride_vd,
    ):  # fmt: skip
        # K and V rows [N, DIM_PAD] of positions pos (zeros where not read).
        offset = (pos % block_size).to(tl.int64)
        kv_mask = read[:, None] & e_ok[None, :]
        k = tl.load(
            k_head + block[:, None] * stride_kb + offset[:, None] * stride_ko + e[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )  # fmt: skip
        v = tl.load(
            v_head + block[:, None] * stride_vb + offset[:, None] * stride_vo + e[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )  # fmt: skip
        return k, v

    @triton.jit
    def _attend_tile(  # type: ignore[no-untyped-def]
        q, k, v, pos, live, new_pos, k_new, v_new, m_i, l_i, acc, scale,
        NEW_KV: tl.constexpr, DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        # One online-softmax step over a tile of keys [N, DIM_PAD]: -> (m_i, l_i, acc). The new
        # token's row comes from registers (this launch writes its slot; it is never read). DOT:
        # the two products on tensor cores (q padded to 16 heads); else as float32 multiply-and-sum
        # over broadcast [HEADS_PAD, N, DIM_PAD] blocks (one or two heads: no padding).
        if NEW_KV:
            is_new = pos == new_pos
            k = tl.where(is_new[:, None], k_new, k)
            v = tl.where(is_new[:, None], v_new, v)
        if DOT:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        else:
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(live[None, :], s * scale, float("-inf"))  # [HEADS_PAD, N], fp32
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every tile holds a live key
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(v.dtype)  # rounded as the tensor-core product takes it, on either path
        if DOT:
            pv = tl.dot(p, v, input_precision=DOT_PRECISION)
        else:
            pv = tl.sum(p.to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        return m_new, l_i, acc

    @triton.jit
    def _decode_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        q_ptr, k_new_ptr, v_new_ptr, cos_ptr, sin_ptr, q_w_ptr, k_w_ptr,
        k_ptr, v_ptr, table_ptr, lens_ptr, hint_table_ptr, hint_lens_ptr,
        out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, counter_ptr,
        stride_qb, stride_qh, stride_qd,  # q [B, H, D]
        stride_nkb, stride_nkh, stride_nkd,  # the new k [B, Hkv, D]
        stride_nvb, stride_nvh, stride_nvd,  # the new v [B, Hkv, D]
        stride_cb, stride_cd, stride_sb, stride_sd,  # cos, sin [B or 1, D] (row stride 0: one shared row)
        stride_qw, stride_kw,  # norm weights [D]
        stride_kb, stride_ko, stride_kh, stride_kd,  # k pool [num_blocks, bs, Hkv, D]
        stride_vb, stride_vo, stride_vh, stride_vd,  # v pool [num_blocks, bs, Hkv, D]
        stride_tb, stride_tm,  # block_tables [B, M]
        stride_hb, stride_hm,  # the hint tables [B, M]
        stride_lb, stride_hlb,  # seq_lens [B], the hint lengths [B] (0: one length broadcast to every row)
        stride_ob, stride_oh, stride_od,  # out [B, H, D]
        scale, block_size, window, q_eps, k_eps,  # window <= 0: none
        num_blocks, capacity,  # the pool's blocks, the table's positions (M * bs): the preload's bounds
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        NUM_SPLITS: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr, FIRST_N: tl.constexpr, PRELOAD: tl.constexpr, DOT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, NEW_KV: tl.constexpr, ROPE: tl.constexpr, Q_NORM: tl.constexpr,
        K_NORM: tl.constexpr, HEADS_C: tl.constexpr, COMBINE_CHUNK: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program (row * head blocks + head block, split): HEADS query heads (a KV head's whole
        # group, or a part of it) over one chunk of their KV head's keys.
        row_head = tl.program_id(0)
        split = tl.program_id(1)
        head_blocks: tl.constexpr = NUM_KV_HEADS * GROUP // HEADS
        row = (row_head // head_blocks).to(tl.int64)
        first_head = (row_head % head_blocks).to(tl.int64) * HEADS
        kvh = first_head // GROUP

        g = tl.arange(0, HEADS_PAD)  # this program's query heads (padded: to a tl.dot tile when DOT)
        e = tl.arange(0, DIM_PAD).to(tl.int64)  # head dim
        g_ok = g < HEADS
        e_ok = e < HEAD_DIM
        first_half = e < HEAD_DIM // 2
        partner = tl.where(first_half, e + HEAD_DIM // 2, e - HEAD_DIM // 2)  # rotate_half's pairing
        q_heads = first_head + g.to(tl.int64)
        qe_mask = g_ok[:, None] & e_ok[None, :]
        k_head = k_ptr + kvh * stride_kh
        v_head = v_ptr + kvh * stride_vh
        table_row = table_ptr + row * stride_tb

        # The norm weights are constants: read before the dependency wait (kernels/pdl.py).
        if Q_NORM != 0:
            q_w = tl.load(q_w_ptr + e * stride_qw, mask=e_ok, other=0.0)
            q_w_partner = tl.load(q_w_ptr + partner * stride_qw, mask=e_ok, other=0.0)
        else:
            q_w = tl.zeros([DIM_PAD], tl.float32)
            q_w_partner = q_w
        if K_NORM != 0:
            k_w = tl.load(k_w_ptr + e * stride_kw, mask=e_ok, other=0.0)
            k_w_partner = tl.load(k_w_ptr + partner * stride_kw, mask=e_ok, other=0.0)
        else:
            k_w = tl.zeros([DIM_PAD], tl.float32)
            k_w_partner = k_w

        if PRELOAD:
            # Speculative: the split's first tile of cached K/V, through the lengths and table as
            # they read before the wait (the hints; module docstring). Clamped, so a stale or
            # unwritten hint only ever reads inside the table and the pool; checked after the wait.
            hint_n = tl.minimum(tl.maximum(tl.load(hint_lens_ptr + row * stride_hlb).to(tl.int32), 1), capacity)
            _, _, hint_start, hint_end = _split_bounds(hint_n, split, window, NUM_SPLITS, BLOCK_N, FIRST_N)
            hint_pos = hint_start + tl.arange(0, FIRST_N)
            hint_live = hint_pos < hint_end
            hint_block = _tile_blocks(hint_table_ptr + row * stride_hb, hint_pos, hint_live, block_size, stride_hm)
            safe_block = tl.minimum(tl.maximum(hint_block, 0), num_blocks - 1)
            k0, v0 = _load_tile(
                k_head, v_head, safe_block, hint_pos, hint_live & (hint_pos != hint_n - 1), block_size, e, e_ok,
                stride_kb, stride_ko, stride_kd, stride_vb, stride_vo, stride_vd,
            )  # fmt: skip

        pdl_prologue(USE_PDL)  # q/k/v, cos/sin, the lengths and the cache come from earlier kernels

        # The length, the new token's q/k/v and its RoPE row do not depend on one another: their
        # loads are all issued here, before anything waits on the length (one round trip, not two).
        n = tl.load(lens_ptr + row * stride_lb).to(tl.int32)
        if PRELOAD:  # the table entries the preload used, as they are now (independent of n)
            check_block = _tile_blocks(table_row, hint_pos, hint_live, block_size, stride_tm)
        if ROPE:
            cos = tl.load(cos_ptr + row * stride_cb + e * stride_cd, mask=e_ok, other=0.0)
            sin = tl.load(sin_ptr + row * stride_sb + e * stride_sd, mask=e_ok, other=0.0)
        else:
            cos = tl.zeros([DIM_PAD], tl.float32)
            sin = cos

        q_row = q_ptr + row * stride_qb + q_heads[:, None] * stride_qh
        q = tl.load(q_row + e[None, :] * stride_qd, mask=qe_mask, other=0.0)  # [HEADS_PAD, DIM_PAD]
        q_p = q
        if ROPE:
            q_p = tl.load(q_row + partner[None, :] * stride_qd, mask=qe_mask, other=0.0)
        q = _prep_heads(q, q_p, q_w, q_w_partner, q_eps, cos, sin, first_half, HEAD_DIM, Q_NORM, ROPE)

        new_pos = n - 1  # the new token's position: its K/V come from registers, never the cache
        if NEW_KV:
            k_row = k_new_ptr + row * stride_nkb + kvh * stride_nkh
            v_row = v_new_ptr + row * stride_nvb + kvh * stride_nvh
            k_new = tl.load(k_row + e[None, :] * stride_nkd, mask=e_ok[None, :], other=0.0)  # [1, DIM_PAD]
            k_p = k_new
            if ROPE:
                k_p = tl.load(k_row + partner[None, :] * stride_nkd, mask=e_ok[None, :], other=0.0)
            k_new = _prep_heads(k_new, k_p, k_w, k_w_partner, k_eps, cos, sin, first_half, HEAD_DIM, K_NORM, ROPE)
            v_new = tl.load(v_row + e[None, :] * stride_nvd, mask=e_ok[None, :], other=0.0)  # V: as is
        else:
            k_new = tl.zeros([1, DIM_PAD], tl.float32)
            v_new = k_new

        used, owner, start, end = _split_bounds(n, split, window, NUM_SPLITS, BLOCK_N, FIRST_N)
        if split >= used:
            return
        if NEW_KV:  # the new slot's block, issued now: its round trip overlaps the attention
            slot_block = tl.load(table_row + (new_pos // block_size) * stride_tm).to(tl.int64)

        # The first tile: FIRST_N keys, preloaded (if the hints held: the same length, the same
        # table entries) or loaded now.
        pos = start + tl.arange(0, FIRST_N)
        live = pos < end
        read = live
        if NEW_KV:
            read = live & (pos != new_pos)  # the new slot is not read: this launch writes it
        if PRELOAD:
            stale = (n != hint_n) | (tl.sum((check_block != hint_block).to(tl.int32), axis=0) != 0)
            if stale:
                k0, v0 = _load_tile(
                    k_head, v_head, _tile_blocks(table_row, pos, live, block_size, stride_tm), pos, read, block_size,
                    e, e_ok, stride_kb, stride_ko, stride_kd, stride_vb, stride_vo, stride_vd,
                )  # fmt: skip
        else:
            k0, v0 = _load_tile(
                k_head, v_head, _tile_blocks(table_row, pos, live, block_size, stride_tm), pos, read, block_size,
                e, e_ok, stride_kb, stride_ko, stride_kd, stride_vb, stride_vo, stride_vd,
            )  # fmt: skip
        m_i = tl.full([HEADS_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([HEADS_PAD], tl.float32)
        acc = tl.zeros([HEADS_PAD, DIM_PAD], tl.float32)
        m_i, l_i, acc = _attend_tile(
            q, k0, v0, pos, live, new_pos, k_new, v_new, m_i, l_i, acc, scale, NEW_KV, DOT, DOT_PRECISION
        )

        for tile in range(start + FIRST_N, end, BLOCK_N):  # the rest of the chunk, BLOCK_N keys at a time
            tile_pos = tile + tl.arange(0, BLOCK_N)  # [BLOCK_N] (not `pos`: a loop may not reshape it)
            tile_live = tile_pos < end
            tile_read = tile_live
            if NEW_KV:
                tile_read = tile_live & (tile_pos != new_pos)
            tile_block = _tile_blocks(table_row, tile_pos, tile_live, block_size, stride_tm)
            k, v = _load_tile(
                k_head, v_head, tile_block, tile_pos, tile_read, block_size, e, e_ok,
                stride_kb, stride_ko, stride_kd, stride_vb, stride_vo, stride_vd,
            )  # fmt: skip
            m_i, l_i, acc = _attend_tile(
                q, k, v, tile_pos, tile_live, new_pos, k_new, v_new, m_i, l_i, acc, scale, NEW_KV, DOT, DOT_PRECISION
            )

        if NEW_KV:  # noqa: SIM102  # a compile-time branch around a runtime one
            # The one program whose split holds n - 1, of the KV head's first head block, stores it.
            if (split == owner) & (n > 0) & (first_head % GROUP == 0):
                slot_offset = (new_pos % block_size).to(tl.int64)
                k_dst = k_head + slot_block * stride_kb + slot_offset * stride_ko + e[None, :] * stride_kd
                v_dst = v_head + slot_block * stride_vb + slot_offset * stride_vo + e[None, :] * stride_vd
                tl.store(k_dst, k_new.to(k_ptr.dtype.element_ty), mask=e_ok[None, :])
                tl.store(v_dst, v_new.to(v_ptr.dtype.element_ty), mask=e_ok[None, :])

        out_dst = out_ptr + row * stride_ob + q_heads[:, None] * stride_oh + e[None, :] * stride_od
        if NUM_SPLITS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a length-0 row: zeros
            tl.store(out_dst, out.to(out_ptr.dtype.element_ty), mask=qe_mask)
        elif used == 1:  # this row's keys fit in one split: no partials, no counter
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(out_dst, out.to(out_ptr.dtype.element_ty), mask=qe_mask)
        else:
            # Partials [B * head blocks, NUM_SPLITS, HEADS, (D)], float32.
            part = (row_head.to(tl.int64) * NUM_SPLITS + split) * HEADS + g  # [HEADS_PAD]
            tl.store(part_max_ptr + part, m_i, mask=g_ok)
            tl.store(part_sum_ptr + part, l_i, mask=g_ok)
            tl.store(part_out_ptr + part[:, None] * HEAD_DIM + e[None, :], acc, mask=qe_mask)
            # Every thread's partial stores before the arrival (the release orders what the block
            # stored; the acquire lets the last arrival see every split's partials).
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr + row_head, 1, sem="acq_rel", scope="gpu")
            if arrived == used - 1:  # the last split to finish combines every split's partials
                _combine_partials(
                    part_out_ptr, part_max_ptr, part_sum_ptr, out_ptr, counter_ptr, row_head, row, first_head, used,
                    stride_ob, stride_oh, stride_od, HEADS, HEAD_DIM, NUM_SPLITS, HEADS_C, DIM_PAD, SPLITS_PAD,
                    COMBINE_CHUNK,
                )  # fmt: skip

    @triton.jit
    def _combine_partials(  # type: ignore[no-untyped-def]
        part_out_ptr, part_max_ptr, part_sum_ptr, out_ptr, counter_ptr, row_head, row, first_head, used,
        stride_ob, stride_oh, stride_od,
        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, HEADS_C: tl.constexpr,
        DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, COMBINE_CHUNK: tl.constexpr,
    ):  # fmt: skip
        # The `used` splits' partials of one (row, head block) -> its HEADS output heads. The heads
        # are padded to HEADS_C (a power of two, not tl.dot's 16: nothing here is a dot), and the
        # partials come in chunks of COMBINE_CHUNK splits, each one vector load [CHUNK, HEADS_C, D]:
        # the loads of a chunk are in flight together, not one split after another. Same
        # arithmetic whoever arrives last: deterministic. Loaded with .cg (L2), never a stale L1 line.
        gc = tl.arange(0, HEADS_C)
        e = tl.arange(0, DIM_PAD).to(tl.int64)
        gc_ok = gc < HEADS
        e_ok = e < HEAD_DIM
        base = row_head.to(tl.int64) * NUM_SPLITS * HEADS
        sp = tl.arange(0, SPLITS_PAD)
        max_mask = (sp < used)[:, None] & gc_ok[None, :]
        m_parts = tl.load(
            part_max_ptr + base + sp[:, None] * HEADS + gc[None, :], mask=max_mask, other=float("-inf"), cache_modifier=".cg"
        )  # [SPLITS_PAD, HEADS_C]
        m_all = tl.where(gc_ok, tl.max(m_parts, axis=0), 0.0)  # [HEADS_C]
        s_parts = tl.load(
            part_sum_ptr + base + sp[:, None] * HEADS + gc[None, :], mask=max_mask, other=0.0, cache_modifier=".cg"
        )
        total = tl.sum(tl.exp(m_parts - m_all[None, :]) * s_parts, axis=0)  # [HEADS_C]; empty splits weigh 0
        combined = tl.zeros([HEADS_C, DIM_PAD], tl.float32)
        for c0 in range(0, used, COMBINE_CHUNK):
            spc = c0 + tl.arange(0, COMBINE_CHUNK)
            idx = base + spc[:, None] * HEADS + gc[None, :]  # [CHUNK, HEADS_C]
            ok = (spc < used)[:, None] & gc_ok[None, :]
            w = tl.exp(tl.load(part_max_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_all[None, :])
            part_acc = tl.load(
                part_out_ptr + idx[:, :, None] * HEAD_DIM + e[None, None, :],
                mask=ok[:, :, None] & e_ok[None, None, :], other=0.0, cache_modifier=".cg",
            )  # [CHUNK, HEADS_C, DIM_PAD]
            combined += tl.sum(w[:, :, None] * part_acc, axis=0)
        out = combined / tl.where(total > 0, total, 1.0)[:, None]
        heads = first_head + gc.to(tl.int64)
        dst = out_ptr + row * stride_ob + heads[:, None] * stride_oh + e[None, :] * stride_od
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=gc_ok[:, None] & e_ok[None, :])
        tl.store(counter_ptr + row_head, 0)  # ready for the next launch


# Arrival counters, one per (row, head block), zero between launches: allocated once per (device,
# size) and kept, so a captured graph holds their address (module docstring).
_COUNTERS: dict[tuple[torch.device, int], Tensor] = {}


def _counters(device: torch.device, size: int) -> Tensor:
    key = (device, size)
    if key not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"decode attention for batch x num_kv_heads = {size} on {device} was first called inside a CUDA graph "
                "capture: call it once before capturing (that call allocates the kernel's arrival counters)"
            )
        _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _COUNTERS[key]


# Splits whose partials the combine loads at once: [chunk, group, head_dim] float32 elements, about
# 4096 of them (32 registers a thread on 4 warps).
COMBINE_ELEMENTS = 4096


# Compile options of every launch. No multiply-add contraction, in any dtype: the roundings eager
# torch does are the arithmetic here, and LLVM narrows a float32 product rounded to bf16/fp16 into a
# 16-bit multiply, which it then fuses with the next add (RoPE's x*cos + r*sin rounded once, not
# three times: on an H100, 10% of normed-and-rotated keys one ulp off). The dots (tensor cores) are
# unaffected; float32 multiply-adds elsewhere cost one more instruction.
LAUNCH_OPTIONS: dict[str, Any] = {"enable_fp_fusion": False}


def _combine_chunk(heads: int, dim_pad: int, num_splits: int) -> int:
    per_split = triton.next_power_of_2(heads) * dim_pad
    return max(1, min(triton.next_power_of_2(num_splits), COMBINE_ELEMENTS // per_split))


def kernel_constexprs(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_splits: int,
    block_n: int,
    dtype: torch.dtype,
    *,
    new_kv: bool,
    rope: bool,
    q_norm: int,
    k_norm: int,
    first_n: int | None = None,
    preload: bool = False,
    heads_per_program: int | None = None,
) -> dict[str, Any]:
    """The kernel's compile-time arguments for a launch of this shape (the launcher's, and what a
    test compiling the kernel ahead of time for a GPU passes); ``q_norm``/``k_norm`` are NORM_* codes,
    ``first_n`` the first tile's keys (None: ``block_n``), ``heads_per_program`` as
    :func:`decode_attention_triton` takes it."""
    group = num_heads // num_kv_heads
    heads = group if heads_per_program is None else heads_per_program
    dim_pad = triton.next_power_of_2(max(head_dim, 16))
    dot = heads == group  # a whole group on tensor cores; a part of one as multiply-and-sums
    return {
        "NUM_KV_HEADS": num_kv_heads, "GROUP": group, "HEADS": heads, "HEAD_DIM": head_dim, "NUM_SPLITS": num_splits,
        # tl.dot's smallest tile is 16 rows; the multiply-and-sum form pads to a power of two only.
        "HEADS_PAD": max(16, triton.next_power_of_2(heads)) if dot else triton.next_power_of_2(heads), "DOT": dot,
        "DIM_PAD": dim_pad, "SPLITS_PAD": triton.next_power_of_2(num_splits), "BLOCK_N": block_n,
        "FIRST_N": block_n if first_n is None else first_n, "PRELOAD": preload,
        "HEADS_C": triton.next_power_of_2(heads), "COMBINE_CHUNK": _combine_chunk(heads, dim_pad, num_splits),
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "NEW_KV": new_kv, "ROPE": rope, "Q_NORM": q_norm, "K_NORM": k_norm,
    }  # fmt: skip


class Tile(NamedTuple):
    """A launch's tiling: keys per tile of the attention loop, keys of each split's first tile
    (the one a preloading launch reads before its dependency wait; also every split's fewest keys),
    warps per program, query heads per program (None: a KV head's whole group)."""

    block_n: int
    first_n: int
    num_warps: int
    heads_per_program: int | None = None


# The tiling by head dim, for the decode steps' preloading launches: H100 measurements (one run
# each, 2026-11-24; benchmarks/log/DECODE_LOG.md). benchmarks/bench_decode_attention.py times a
# chain of 16 layers' attention, us a layer at 128 / 4096 / 16384 positions; decode_compare.py the
# compiled model step at 128 positions, where the kernel also shares the GPU with the projections.
# Head dim 64 (Llama-3.2-1B): 64-key first tiles, 16-key tiles on 4 warps: 4.26 / 12.77 us against
# 4.90 / 15.93 for 64-key tiles throughout (the compiled step: 889-908 tok/s in three runs).
# 128 (Qwen3-1.7B): 32-key first tiles, 16-key tiles on 2 warps, the one setting without register
# spills (ptxas): 5.80 / 15.94 / 40.29 us against 5.83 / 22.83 / 49.02 for 32 keys on 4 warps.
# 256 (Gemma-3-1b): a program per query head (multiply-and-sums), 16-key tiles on 4 warps: 5.12 /
# 8.60 / 16.66 us at 128 / 1024 / 4096 against 8.22 / 23.48 / 33.08 for its group of 4 heads on
# tensor cores (padded to 16 rows: 222 registers a thread); on 2 warps 5.62 / 8.90 / 15.92; the
# compiled step 885.7 against 787.7 tok/s in one run, 888.2 in another. A program per head was
# slower for Llama (4.82 / 11.75 / 36.57 against 4.30 / 7.40 / 12.89 us; the step 907.4 against
# 921.9) and Qwen3 (5.30 / 10.45 / 25.97 against 5.81 / 8.80 / 16.39; 608.1 against 616.7):
# their groups on tensor cores share each K/V tile among more heads per read.
TILES_BY_HEAD_DIM: dict[int, Tile] = {64: Tile(16, 64, 4), 128: Tile(16, 32, 2), 256: Tile(16, 16, 4, 1)}


def default_tile(head_dim: int) -> Tile:
    """The :class:`Tile` for a head dim (padded to a power of two; the largest entry above 256, the
    smallest below 64)."""
    dim_pad = 1 << (max(head_dim, 1) - 1).bit_length()  # the next power of two
    return TILES_BY_HEAD_DIM[min(max(dim_pad, 64), 256)]


def _is_tile_size(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 16 and not value & (value - 1)


def _check_launch_knobs(
    num_splits: int | None,
    block_n: int | None,
    num_warps: int | None,
    num_stages: int,
    first_n: int | None = None,
    heads_per_program: int | None = None,
    group: int | None = None,
) -> None:
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    if block_n is not None and not _is_tile_size(block_n):
        raise ValueError(f"block_n must be a power of two >= 16 (a tl.dot tile) or None, got {block_n!r}")
    if first_n is not None and not _is_tile_size(first_n):
        raise ValueError(f"first_n must be a power of two >= 16 (a tl.dot tile) or None, got {first_n!r}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be one of (1, 2, 4, 8, 16) or None, got {num_warps!r}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    if heads_per_program is not None:
        h = heads_per_program
        if isinstance(h, bool) or not isinstance(h, int) or h < 1 or (group is not None and group % h):
            raise ValueError(
                f"heads_per_program must be None or a positive int dividing the group of query heads per KV head "
                f"({group}), got {h!r}"
            )


def launch_decode_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    cos: Tensor | None,
    sin: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None,
    q_norm: NormSpec | None,
    k_norm: NormSpec | None,
    num_splits: int | None,
    block_n: int | None,
    num_warps: int | None,
    num_stages: int,
    out: Tensor | None = None,
    *,
    first_n: int | None = None,
    preload: bool = False,
    hints: tuple[Tensor, Tensor] | None = None,
    heads_per_program: int | None = None,
) -> Tensor:
    """Launch the kernel (arguments already checked). ``k``/``v`` None: no new token (the paged
    attention of a prefix already stored, q already rotated): prep stages off by constexprs.
    ``out``: a ``[B, H, D]`` buffer in q's dtype to write into (None: a new contiguous one).
    ``first_n``, ``preload``: :func:`decode_attention_triton`. ``hints``: ``(seq_lens, block_tables)``
    the preload reads before its dependency wait instead of the real ones (tests use it to exercise
    stale hints; None: the real ones, which is what a launch does). ``heads_per_program``:
    :func:`decode_attention_triton`."""
    group = q.shape[1] // k_cache.shape[2] if q.dim() == 3 and k_cache.dim() == 4 else None
    _check_launch_knobs(num_splits, block_n, num_warps, num_stages, first_n, heads_per_program, group)
    if not isinstance(preload, bool):
        raise TypeError(f"preload must be a bool, got {type(preload).__name__}")
    if preload and (k is None or v is None):
        raise ValueError(
            "preload needs the new token's k and v: without them the kernel reads the slot n - 1 from the cache, "
            "which the kernel launched just before (the store) writes"
        )
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"the kernel takes bfloat16, float16 or float32, got {q.dtype} (the reference takes any float)")
    b, h, d = q.shape
    if out is None:
        out = q.new_empty((b, h, d))  # contiguous, whatever q's strides
    elif not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        what = (tuple(out.shape), out.dtype, out.device) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"out must be a [B, H, D] = {tuple(q.shape)} tensor of {q.dtype} on {q.device}, got {what}")
    _, block_size, hkv, _ = k_cache.shape
    group = h // hkv
    tile = default_tile(d)
    # The heads a program takes: the knob (checked above), else the tiling's choice (1), else the group.
    heads = (tile.heads_per_program or group) if heads_per_program is None else heads_per_program
    head_blocks = hkv * group // heads
    block_n = tile.block_n if block_n is None else block_n
    first_n = max(tile.first_n, block_n) if first_n is None else first_n
    if first_n < block_n:
        raise ValueError(f"first_n ({first_n}) must be at least block_n ({block_n}): chunks are whole tiles")
    num_warps = tile.num_warps if num_warps is None else num_warps
    capacity = block_tables.shape[1] * block_size
    max_visible = capacity if window is None else min(capacity, window)
    if num_splits is None:
        # Off a GPU (the interpreter) there are no SMs to fill: one wave's worth.
        sms = _sm_count(q.device.index or 0) if q.device.type == "cuda" else 1
        num_splits = decode_num_splits(b, head_blocks, max_visible, first_n, sms)
    hint_lens, hint_tables = (seq_lens, block_tables) if hints is None else hints
    if hint_tables.shape != block_tables.shape or hint_lens.shape != seq_lens.shape:
        raise ValueError(
            f"hints must be shaped like (seq_lens, block_tables) {tuple(seq_lens.shape)}, {tuple(block_tables.shape)}, "
            f"got {tuple(hint_lens.shape)}, {tuple(hint_tables.shape)}"
        )
    if b == 0:
        return out
    new_kv = k is not None and v is not None
    if num_splits > 1:
        part_out = torch.empty((b * head_blocks, num_splits, heads, d), device=q.device, dtype=torch.float32)
        part_max = torch.empty((b * head_blocks, num_splits, heads), device=q.device, dtype=torch.float32)
        part_sum = torch.empty_like(part_max)
        counters = _counters(q.device, b * head_blocks)
    else:  # one split: no partials, no counter (the pointers are never dereferenced)
        part_out = part_max = part_sum = out
        counters = seq_lens
    nk = k if k is not None else q  # placeholders where a stage is off: never dereferenced
    nv = v if v is not None else q
    rope = cos is not None and sin is not None
    c = cos if cos is not None else q
    s = sin if sin is not None else q
    qw = q_norm.weight if q_norm is not None else q
    kw = k_norm.weight if k_norm is not None else q
    args: list[Any] = [q, nk, nv, c, s, qw, kw, k_cache, v_cache, block_tables, seq_lens, hint_tables, hint_lens]
    args += [out, part_out, part_max, part_sum, counters]
    args += [*q.stride(), *nk.stride()[:3], *nv.stride()[:3]]
    args += [(c.stride(0) if c.shape[0] > 1 else 0) if rope else 0, c.stride(-1) if rope else 0]
    args += [(s.stride(0) if s.shape[0] > 1 else 0) if rope else 0, s.stride(-1) if rope else 0]
    args += [qw.stride(0) if q_norm is not None else 0, kw.stride(0) if k_norm is not None else 0]
    args += [*k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *hint_tables.stride()]
    args += [seq_lens.stride(0), hint_lens.stride(0), *out.stride()]
    args += [float(scale), block_size, 0 if window is None else window]
    args += [float(q_norm.eps) if q_norm is not None else 1.0, float(k_norm.eps) if k_norm is not None else 1.0]
    args += [k_cache.shape[0], capacity]
    constexprs = kernel_constexprs(
        h, hkv, d, num_splits, block_n, q.dtype, new_kv=new_kv, rope=rope,
        q_norm=_norm_code(q_norm), k_norm=_norm_code(k_norm if new_kv else None), first_n=first_n, preload=preload,
        heads_per_program=heads,
    )  # fmt: skip
    _decode_attention_kernel[(b * head_blocks, num_splits)](
        *args,
        **constexprs,
        num_warps=num_warps, num_stages=num_stages,
        **LAUNCH_OPTIONS,
        **pdl_options(q.device),
    )  # fmt: skip
    return out


def decode_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor | None,
    sin: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
    q_norm: NormSpec | None = None,
    k_norm: NormSpec | None = None,
    num_splits: int | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
    out: Tensor | None = None,
    first_n: int | None = None,
    preload: bool = False,
    heads_per_program: int | None = None,
) -> Tensor:
    """The fused kernel (CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``): the contract of
    :func:`decode_attention_reference`, ``[B, H, D]``. ``num_splits`` overrides the split heuristic
    (tests use it); ``block_n`` (keys per tile), ``first_n`` (keys of each split's first tile, at
    least ``block_n``), ``num_warps`` and ``num_stages`` are launch knobs (None: :func:`default_tile`
    of the head dim); ``out`` (``[B, H, D]``, q's dtype, any strides) receives the result when
    given (tests pass NaN-filled buffers, so an element the kernel never writes shows).
    ``heads_per_program``: query heads per program, a divisor of the group (query heads per KV
    head); None: the tiling's choice (:func:`default_tile`). A program taking the whole group runs
    its two products on tensor cores (the query block padded to 16 heads); one taking a part of it
    (more programs, each reading its KV head's keys) runs them as float32 multiply-and-sums, with
    no padding.

    ``preload``: read each split's first tile of cached K/V before the dependency wait (module
    docstring), so it overlaps the previous kernel's tail. A promise of the caller's: the kernel
    launched just before this one does not write this layer's cached K/V (positions before
    ``seq_lens - 1``). The lengths and table may be written by it: they are read again after the
    wait, and a tile read through stale ones is read again.

    Host checks only: no sync, allocations sized by shapes alone, so the call can be captured once
    a first call has allocated the arrival counters. ``seq_lens`` must be in ``[1, M * block_size]``,
    the table entries valid block ids and the rows' new slots distinct; the kernel cannot check
    values without a sync (the reference does).
    """
    check_decode_attention_args(q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window, q_norm, k_norm)
    return launch_decode_attention(
        q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window, q_norm, k_norm,
        num_splits, block_n, num_warps, num_stages, out, first_n=first_n, preload=preload,
        heads_per_program=heads_per_program,
    )  # fmt: skip


def decode_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor | None,
    sin: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
    q_norm: NormSpec | None = None,
    k_norm: NormSpec | None = None,
) -> Tensor:
    """:func:`decode_attention_reference`'s contract (the dispatching entry point): ``[B, H, D]``.

    On CUDA with Triton (bf16/fp16/fp32): the fused kernel, called through the custom op
    ``infer_ref::decode_attention``, which declares that it mutates ``k_cache`` and ``v_cache``, so
    ``torch.compile`` keeps it as one opaque node writing the cache in place. Elsewhere: the
    reference.
    """
    check_decode_attention_args(q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window, q_norm, k_norm)
    if HAVE_TRITON and q.is_cuda and q.dtype in KERNEL_DTYPES:
        return torch.ops.infer_ref.decode_attention(
            q, k, v, cos, sin, *_norm_args(q_norm), *_norm_args(k_norm),
            k_cache, v_cache, block_tables, seq_lens, float(scale), 0 if window is None else window,
        )  # fmt: skip
    return decode_attention_reference(q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window, q_norm, k_norm)


# -- the custom op (torch.compile sees one node that writes the cache; CUDA graphs capture the launch) --
# A custom op takes tensors and scalars only: each norm travels as (weight or None, eps, formula).


def _norm_args(spec: NormSpec | None) -> tuple[Tensor | None, float, bool]:
    return (None, 1e-6, False) if spec is None else (spec.weight, float(spec.eps), spec.unit_offset)


def _norm_spec(weight: Tensor | None, eps: float, unit_offset: bool) -> NormSpec | None:
    return None if weight is None else NormSpec(weight, eps, unit_offset)


@torch.library.custom_op("infer_ref::decode_attention", mutates_args=("k_cache", "v_cache"))
def _decode_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor | None,
    sin: Tensor | None,
    q_norm_weight: Tensor | None,
    q_norm_eps: float,
    q_norm_unit_offset: bool,
    k_norm_weight: Tensor | None,
    k_norm_eps: float,
    k_norm_unit_offset: bool,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    return decode_attention_triton(
        q, k, v, cos, sin, k_cache, v_cache, block_tables, seq_lens, scale, window or None,
        q_norm=_norm_spec(q_norm_weight, q_norm_eps, q_norm_unit_offset),
        k_norm=_norm_spec(k_norm_weight, k_norm_eps, k_norm_unit_offset),
    )  # fmt: skip


@_decode_attention_op.register_fake
def _decode_attention_fake(q: Tensor, *args: object) -> Tensor:
    return q.new_empty(q.shape)


__all__ = [
    "KERNEL_DTYPES",
    "check_decode_attention_args",
    "decode_attention",
    "decode_attention_reference",
    "decode_attention_triton",
    "launch_decode_attention",
]
