"""The decode attention kernel (flash-decoding with the new token's prep and the split combine in
one launch; the package docstring describes it, ``launch.py`` launches it).
"""

from __future__ import annotations

from infer_ref.fast.kernels.common import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from infer_ref.fast.kernels.common import pdl_prologue

# The NORM constexpr: which RMSNorm formula (infer_ref/norm.py), or none.
NORM_NONE, NORM_LLAMA, NORM_GEMMA = 0, 1, 2

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

        # The norm weights are constants: read before the dependency wait (kernels/common.py).
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


__all__ = ["NORM_GEMMA", "NORM_LLAMA", "NORM_NONE"]
