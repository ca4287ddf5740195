"""The Triton kernels of the decode matrix-vector products (the package docstring describes what
they compute; ``launch.py`` launches them).

``_gemv_kernel``: a program per column block and K slice, the in_norm prologue, the weight-tile
prefetch, the residual epilogue with one slice. Where needed, a combine kernel follows: the split-K
combine (``_combine_kernel``: partials summed in slice order, then finished, then the residual) or
the out_norm combine (``_combine_norm_kernel``: a program per whole row).
"""

from __future__ import annotations

from infer_ref.fast.kernels.common import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from infer_ref.fast.kernels.common import pdl_prologue

# The kernels' activation codes (a Triton constexpr), one per name of ``reference.ACTIVATIONS``.
ACT_CODES = {"silu": 0, "gelu_pytorch_tanh": 1}

if HAVE_TRITON:

    @triton.jit
    def _finish(  # type: ignore[no-untyped-def]  # Triton reads the signature
        acc, acc_up, bias_ptr, offs_n, n_ok,
        OUT_DTYPE: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        # acc, acc_up [R, C] float32 sums -> [R, C] in OUT_DTYPE, rounding where eager torch rounds.
        if GATED:
            g = acc.to(OUT_DTYPE).to(tl.float32)
            u = acc_up.to(OUT_DTYPE).to(tl.float32)
            if ACT == 0:  # silu, as ATen writes it: x / (1 + exp(-x))
                a = g / (1.0 + tl.exp(-g))
            else:  # gelu tanh: 0.5 x (1 + tanh(y)), y = sqrt(2/pi) (x + 0.044715 x^3)
                # 0.5 (1 + tanh(y)) is sigmoid(2y): no cancellation where tanh(y) nears -1.
                inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
                a = g / (1.0 + tl.exp(-2.0 * inner))
            a = a.to(OUT_DTYPE).to(tl.float32)
            y = (a * u).to(OUT_DTYPE)
        else:
            if HAS_BIAS:
                acc = acc + tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            y = acc.to(OUT_DTYPE)
        return y

    @triton.jit
    def _load_residual(res_ptr, offs_m, offs_n, mask, stride_rm, stride_rn):  # type: ignore[no-untyped-def]
        # The residual's [R, C] tile at rows offs_m, columns offs_n.
        return tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)

    @triton.jit
    def _plus_residual(r, y32, OUT_DTYPE: tl.constexpr):  # type: ignore[no-untyped-def]
        # y32 [R, C]: the output already rounded to the dtype (as eager's `residual + y` sees it), in
        # float32; r the residual tile -> round(r32 + y32) in OUT_DTYPE.
        return (r.to(tl.float32) + y32).to(OUT_DTYPE)

    @triton.jit
    def _rstd(sum_sq, count, eps):  # type: ignore[no-untyped-def]
        # 1 / sqrt(mean + eps) with IEEE sqrt and division: within two roundings of the exact value.
        return 1.0 / tl.sqrt_rn(sum_sq / count + eps)

    @triton.jit
    def _row_rstds(  # type: ignore[no-untyped-def]
        x_ptr, rows, k, eps, stride_xm, stride_xk,
        ROWS_PAD: tl.constexpr, NORM_ROWS: tl.constexpr, NORM_BLOCK: tl.constexpr,
    ):  # fmt: skip
        # rstd [ROWS_PAD] of each row's mean square over ALL of K (whichever slice the program
        # multiplies); padded rows get 1. One row at a time, unrolled over the NORM_ROWS real rows
        # (not the dot paths' 16 padded ones): the loads of different rows are independent, so they
        # are in flight together, and a 1B model's hidden row is one load (NORM_BLOCK >= K).
        offs_m = tl.arange(0, ROWS_PAD)
        rstd = tl.full([ROWS_PAD], 1.0, tl.float32)
        for r in tl.static_range(NORM_ROWS):
            row_ptr = x_ptr + r * stride_xm
            sum_sq = tl.zeros([NORM_BLOCK], tl.float32)
            for k0 in range(0, k, NORM_BLOCK):
                offs = k0 + tl.arange(0, NORM_BLOCK)
                ok = (offs < k) & (r < rows)
                xr = tl.load(row_ptr + offs * stride_xk, mask=ok, other=0.0).to(tl.float32)
                sum_sq += xr * xr
            rstd = tl.where(offs_m == r, _rstd(tl.sum(sum_sq, axis=0), k, eps), rstd)
        return rstd

    @triton.jit
    def _normalise(t, w_ptr, offs, ok, rstd, WHOLE: tl.constexpr, UNIT_OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]
        # t [R, C] in the activation dtype, columns offs of the normalised dimension; rstd [R] float32.
        # -> rms_norm(t) [R, C] in that dtype, rounding as infer_ref.norm.rms_norm does.
        w = tl.load(w_ptr + offs) if WHOLE else tl.load(w_ptr + offs, mask=ok, other=0.0)
        return _normalise_by(t, w, rstd, UNIT_OFFSET)

    @triton.jit
    def _normalise_by(t, w, rstd, UNIT_OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]
        # As _normalise, with the norm weight's [C] values w already loaded.
        w = w.to(tl.float32)[None, :]
        n = t.to(tl.float32) * rstd[:, None]
        # Gemma: x32 * rstd * (1 + w32), rounded once; Llama/Qwen: round(x32 * rstd), then times w
        # in the dtype (a float32 product, rounded).
        h = n * (1.0 + w) if UNIT_OFFSET else w * n.to(t.dtype).to(tl.float32)
        return h.to(t.dtype)

    @triton.jit
    def _load_tile(ptrs, row_ok, col_ok, ROWS_WHOLE: tl.constexpr, COLS_WHOLE: tl.constexpr):  # type: ignore[no-untyped-def]
        # A [R, C] tile; a side known to lie wholly in range needs no mask (plain vector loads).
        if ROWS_WHOLE and COLS_WHOLE:
            tile = tl.load(ptrs)
        elif ROWS_WHOLE:
            tile = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
        elif COLS_WHOLE:
            tile = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        return tile

    @triton.jit
    def _x_tile(  # type: ignore[no-untyped-def]
        x_rows, stride_xk, offs_k, m_ok, k_ok, norm_w_ptr, rstd,
        EVEN_K: tl.constexpr, IN_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    ):  # fmt: skip
        # x's [ROWS_PAD, BLOCK_K] tile at columns offs_k, normalised when IN_NORM (in x's dtype).
        xt = _load_tile(x_rows + offs_k[None, :] * stride_xk, m_ok, k_ok, False, EVEN_K)
        if IN_NORM:
            xt = _normalise(xt, norm_w_ptr, offs_k, k_ok, rstd, EVEN_K, UNIT_OFFSET)
        return xt

    @triton.jit
    def _acc_zeros(ROWS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PATH: tl.constexpr):  # type: ignore[no-untyped-def]
        if PATH == 0:  # dot: [ROWS_PAD, BLOCK_N]
            acc = tl.zeros([ROWS_PAD, BLOCK_N], tl.float32)
        elif PATH == 1:  # dot_t: the transpose, [BLOCK_N, ROWS_PAD]
            acc = tl.zeros([BLOCK_N, ROWS_PAD], tl.float32)
        elif ROWS_PAD == 1:  # fma, one row: products accumulate per (column, k lane), reduced at the end
            acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        else:  # fma: the same per (row, column, k lane)
            acc = tl.zeros([ROWS_PAD, BLOCK_N, BLOCK_K], tl.float32)
        return acc

    @triton.jit
    def _mac(acc, xt, wt, PATH: tl.constexpr, ROWS_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
        # acc (shaped as _acc_zeros makes it) += xt [ROWS_PAD, BLOCK_K] times wt [BLOCK_N, BLOCK_K]^T.
        if PATH == 0:
            acc = tl.dot(xt, tl.trans(wt), acc, input_precision=DOT_PRECISION)
        elif PATH == 1:
            acc = tl.dot(wt, tl.trans(xt), acc, input_precision=DOT_PRECISION)
        elif ROWS_PAD == 1:
            # An explicit multiply-add: the launches turn contraction off (LAUNCH_OPTIONS), and a
            # product of two 16-bit values is exact in float32, so fma(w, x, acc) == acc + w * x.
            acc = tl.fma(wt.to(tl.float32), xt.to(tl.float32), acc)  # x [1, BLOCK_K] broadcast over the columns
        else:
            acc = tl.fma(xt.to(tl.float32)[:, None, :], wt.to(tl.float32)[None, :, :], acc)
        return acc

    @triton.jit
    def _acc_rows(acc, PATH: tl.constexpr, ROWS_PAD: tl.constexpr):  # type: ignore[no-untyped-def]
        # The accumulator as [ROWS_PAD, BLOCK_N] sums.
        if PATH == 0:
            sums = acc
        elif PATH == 1:
            sums = tl.trans(acc)
        elif ROWS_PAD == 1:
            sums = tl.sum(acc, axis=1)[None, :]
        else:
            sums = tl.sum(acc, axis=2)
        return sums

    @triton.jit
    def _weight_tiles(  # type: ignore[no-untyped-def]
        w_rows, w_up_rows, k0, k, n_ok,
        BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, GATED: tl.constexpr,
    ):  # fmt: skip
        # The weight's [BLOCK_N, BLOCK_K] tile at columns [k0, k0 + BLOCK_K), and the up rows' tile
        # when GATED (else the same tile again, never used).
        offs_k = k0 + tl.arange(0, BLOCK_K)
        wt = _load_tile(w_rows + offs_k[None, :], n_ok, offs_k < k, EVEN_N, EVEN_K)
        wu = wt
        if GATED:
            wu = _load_tile(w_up_rows + offs_k[None, :], n_ok, offs_k < k, EVEN_N, EVEN_K)
        return wt, wu

    @triton.jit
    def _x_tile_at(  # type: ignore[no-untyped-def]
        x_rows, stride_xk, k0, k, m_ok, norm_w_ptr, rstd,
        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IN_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    ):  # fmt: skip
        # x's [ROWS_PAD, BLOCK_K] tile at columns [k0, k0 + BLOCK_K), normalised when IN_NORM.
        offs_k = k0 + tl.arange(0, BLOCK_K)
        return _x_tile(x_rows, stride_xk, offs_k, m_ok, offs_k < k, norm_w_ptr, rstd, EVEN_K, IN_NORM, UNIT_OFFSET)

    @triton.jit
    def _mac_tiles(  # type: ignore[no-untyped-def]
        acc, acc_up, xt, wt, wu,
        PATH: tl.constexpr, ROWS_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, GATED: tl.constexpr,
    ):  # fmt: skip
        # acc (and acc_up) += the x tile times the weight tile (and the up rows' tile).
        acc = _mac(acc, xt, wt, PATH, ROWS_PAD, DOT_PRECISION)
        if GATED:
            acc_up = _mac(acc_up, xt, wu, PATH, ROWS_PAD, DOT_PRECISION)
        return acc, acc_up

    @triton.jit
    def _gemv_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, norm_w_ptr, res_ptr,
        rows, n_out, k, tiles_per_split, up_offset, eps,  # up_offset: rows from gate row j to up row j (I)
        stride_xm, stride_xk, stride_om, stride_ps, stride_pm, stride_rm, stride_rn,  # x [M, K], out, parts [S, M, *], residual
        ROWS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PATH: tl.constexpr,
        EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, GATED: tl.constexpr,
        ACT: tl.constexpr, HAS_BIAS: tl.constexpr, IN_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
        NORM_ROWS: tl.constexpr, NORM_BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        PREFETCH_TILES: tl.constexpr, PREFETCH_RESIDUAL: tl.constexpr, WRITE_PARTIALS: tl.constexpr,
        WEIGHT_FIRST: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program (column block, K slice): columns [n0, n0 + BLOCK_N) of every row over one slice of K.
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        n_ok = offs_n < n_out
        offs_m = tl.arange(0, ROWS_PAD)  # [ROWS_PAD]
        m_ok = offs_m < rows
        # Every slice walks the same tile count (a kernel argument, not derived from the program id:
        # a uniform trip count pipelines best) and ends where the next begins; tiles past K load nothing.
        k_start = split * tiles_per_split * BLOCK_K
        # Row pointers in int64: row * K overflows int32 for weights past 2**31 elements.
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k  # [BLOCK_N, 1]
        w_up_rows = w_ptr + (offs_n + up_offset).to(tl.int64)[:, None] * k  # read only if GATED
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [ROWS_PAD, 1]
        acc = _acc_zeros(ROWS_PAD, BLOCK_N, BLOCK_K, PATH)
        acc_up = _acc_zeros(ROWS_PAD, BLOCK_N, BLOCK_K, PATH)
        # No earlier kernel writes the weight (weight_is_constant): the first PREFETCH_TILES tiles'
        # loads go out before the grid-dependency wait, overlapping the predecessor's tail (peeled
        # off the loop; the host caps PREFETCH_TILES at the slice's tile count).
        if PREFETCH_TILES >= 1:
            w_first, wu_first = _weight_tiles(w_rows, w_up_rows, k_start, k, n_ok, BLOCK_K, EVEN_N, EVEN_K, GATED)
        if PREFETCH_TILES >= 2:
            w_second, wu_second = _weight_tiles(
                w_rows, w_up_rows, k_start + BLOCK_K, k, n_ok, BLOCK_K, EVEN_N, EVEN_K, GATED
            )
        if PREFETCH_RESIDUAL:
            # Written before the kernel just before this one (residual_is_settled): the epilogue's
            # residual comes in before the wait, off the end of the kernel's critical path.
            r_early = _load_residual(res_ptr, offs_m, offs_n, m_ok[:, None] & n_ok[None, :], stride_rm, stride_rn)
        pdl_prologue(USE_PDL)  # x (and otherwise the residual) are earlier kernels' outputs: read only after it
        rstd = tl.full([ROWS_PAD], 1.0, tl.float32)
        if IN_NORM:
            rstd = _row_rstds(x_ptr, rows, k, eps, stride_xm, stride_xk, ROWS_PAD, NORM_ROWS, NORM_BLOCK)
        if PREFETCH_TILES >= 1:
            xt = _x_tile_at(x_rows, stride_xk, k_start, k, m_ok, norm_w_ptr, rstd, BLOCK_K, EVEN_K, IN_NORM, UNIT_OFFSET)
            acc, acc_up = _mac_tiles(acc, acc_up, xt, w_first, wu_first, PATH, ROWS_PAD, DOT_PRECISION, GATED)
        if PREFETCH_TILES >= 2:
            k0 = k_start + BLOCK_K
            xt = _x_tile_at(x_rows, stride_xk, k0, k, m_ok, norm_w_ptr, rstd, BLOCK_K, EVEN_K, IN_NORM, UNIT_OFFSET)
            acc, acc_up = _mac_tiles(acc, acc_up, xt, w_second, wu_second, PATH, ROWS_PAD, DOT_PRECISION, GATED)
        for tile in range(PREFETCH_TILES, tiles_per_split):
            k0 = k_start + tile * BLOCK_K
            if WEIGHT_FIRST:  # the weight tile's loads issued first, then x's (the config's order)
                wt, wu = _weight_tiles(w_rows, w_up_rows, k0, k, n_ok, BLOCK_K, EVEN_N, EVEN_K, GATED)
                xt = _x_tile_at(x_rows, stride_xk, k0, k, m_ok, norm_w_ptr, rstd, BLOCK_K, EVEN_K, IN_NORM, UNIT_OFFSET)
            else:
                xt = _x_tile_at(x_rows, stride_xk, k0, k, m_ok, norm_w_ptr, rstd, BLOCK_K, EVEN_K, IN_NORM, UNIT_OFFSET)
                wt, wu = _weight_tiles(w_rows, w_up_rows, k0, k, n_ok, BLOCK_K, EVEN_N, EVEN_K, GATED)
            acc, acc_up = _mac_tiles(acc, acc_up, xt, wt, wu, PATH, ROWS_PAD, DOT_PRECISION, GATED)
        sums = _acc_rows(acc, PATH, ROWS_PAD)  # [ROWS_PAD, BLOCK_N]
        sums_up = _acc_rows(acc_up, PATH, ROWS_PAD)
        mask = m_ok[:, None] & n_ok[None, :]
        if WRITE_PARTIALS:
            part = part_ptr + split * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :]
            tl.store(part, sums, mask=mask)
            if GATED:
                tl.store(part + up_offset, sums_up, mask=mask)
        else:
            y = _finish(sums, sums_up, bias_ptr, offs_n, n_ok, out_ptr.dtype.element_ty, GATED, ACT, HAS_BIAS)
            if HAS_RESIDUAL:
                if PREFETCH_RESIDUAL:
                    r = r_early
                else:
                    r = _load_residual(res_ptr, offs_m, offs_n, mask, stride_rm, stride_rn)
                y = _plus_residual(r, y.to(tl.float32), y.dtype)
            tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y, mask=mask)

    @triton.jit
    def _sum_partials(  # type: ignore[no-untyped-def]
        part_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, up_offset,
        GATED: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # Row `row`, columns offs_n [BLOCK]: the split partials summed in split order 0, 1, ... -> [1, BLOCK].
        base = part_ptr + row * stride_pm + offs_n[None, :]  # [1, BLOCK]
        acc = tl.zeros([1, BLOCK], tl.float32)
        acc_up = tl.zeros([1, BLOCK], tl.float32)
        for s in range(0, splits):
            acc += tl.load(base + s * stride_ps, mask=n_ok[None, :], other=0.0)
            if GATED:
                acc_up += tl.load(base + s * stride_ps + up_offset, mask=n_ok[None, :], other=0.0)
        return acc, acc_up

    @triton.jit
    def _combine_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        part_ptr, bias_ptr, out_ptr, res_ptr,
        splits, n_out, up_offset, stride_ps, stride_pm, stride_om, stride_rm, stride_rn,
        BLOCK: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program (column block, row): sum the split partials in split order 0, 1, ... and finish.
        pid = tl.program_id(0)
        row = tl.program_id(1)
        offs_n = pid * BLOCK + tl.arange(0, BLOCK)
        n_ok = offs_n < n_out
        if HAS_RESIDUAL:  # before the wait: see _combine_norm_kernel
            r = _load_residual(res_ptr, row + tl.arange(0, 1), offs_n, n_ok[None, :], stride_rm, stride_rn)
        pdl_prologue(USE_PDL)
        acc, acc_up = _sum_partials(
            part_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, up_offset, GATED, BLOCK
        )
        y = _finish(acc, acc_up, bias_ptr, offs_n, n_ok, out_ptr.dtype.element_ty, GATED, ACT, HAS_BIAS)
        if HAS_RESIDUAL:
            y = _plus_residual(r, y.to(tl.float32), y.dtype)
        tl.store(out_ptr + row * stride_om + offs_n[None, :], y, mask=n_ok[None, :])

    @triton.jit
    def _finished_block(  # type: ignore[no-untyped-def]
        part_ptr, bias_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm,
        OUT_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # The linear output y [1, BLOCK] of row `row` at columns offs_n, rounded to OUT_DTYPE.
        acc, acc_up = _sum_partials(
            part_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, 0, False, BLOCK
        )
        return _finish(acc, acc_up, bias_ptr, offs_n, n_ok, OUT_DTYPE, False, 0, HAS_BIAS)

    @triton.jit
    def _row_inputs(  # type: ignore[no-untyped-def]
        norm_w_ptr, res_ptr, row, offs_n, n_ok, stride_rm, stride_rn, HAS_RESIDUAL: tl.constexpr
    ):  # fmt: skip
        # The out_norm weight [BLOCK] and the residual [1, BLOCK] at columns offs_n of row `row`
        # (without a residual the weight stands in for it, never read).
        w = tl.load(norm_w_ptr + offs_n, mask=n_ok, other=0.0)
        r = w
        if HAS_RESIDUAL:
            r = _load_residual(res_ptr, row + tl.arange(0, 1), offs_n, n_ok[None, :], stride_rm, stride_rn)
        return w, r

    @triton.jit
    def _store_normed(  # type: ignore[no-untyped-def]
        y, rstd, w, r, out_ptr, row, offs_n, n_ok, stride_om, UNIT_OFFSET: tl.constexpr, HAS_RESIDUAL: tl.constexpr
    ):  # fmt: skip
        # out = r + rms_norm(y) at columns offs_n of row `row`, from the loaded weight w and residual r.
        o = _normalise_by(y, w, rstd, UNIT_OFFSET)
        if HAS_RESIDUAL:
            o = _plus_residual(r, o.to(tl.float32), o.dtype)
        tl.store(out_ptr + row * stride_om + offs_n[None, :], o, mask=n_ok[None, :])

    @triton.jit
    def _combine_norm_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        part_ptr, bias_ptr, out_ptr, norm_w_ptr, res_ptr,
        splits, n_out, eps, stride_ps, stride_pm, stride_om, stride_rm, stride_rn,
        BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr, UNIT_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program `row` owns the whole output row: finish it, rms_norm it over all N columns, then
        # add the residual. The norm's mean square is of the ROUNDED row, as eager's norm reads it.
        row = tl.program_id(0)
        out_dtype = out_ptr.dtype.element_ty
        if ONE_BLOCK:  # the row fits one block: finished once, kept in registers
            offs_n = tl.arange(0, BLOCK)
            n_ok = offs_n < n_out
            # Everything but the partials comes in before the wait. The kernel before this one is
            # the call's own product, which writes only partials; when this kernel starts, that
            # product has passed its own wait, so whatever wrote the call's other inputs (the norm
            # weight, the residual) has finished (kernels/common.py). After the wait only the
            # partials' round trip is left before the stores.
            w, r = _row_inputs(norm_w_ptr, res_ptr, row, offs_n, n_ok, stride_rm, stride_rn, HAS_RESIDUAL)
            pdl_prologue(USE_PDL)
            y = _finished_block(part_ptr, bias_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, out_dtype, HAS_BIAS, BLOCK)
            y32 = y.to(tl.float32)
            rstd = _rstd(tl.sum(y32 * y32, axis=1), n_out, eps)  # [1]
            _store_normed(y, rstd, w, r, out_ptr, row, offs_n, n_ok, stride_om, UNIT_OFFSET, HAS_RESIDUAL)
        else:  # two walks over the row's blocks: the squares, then the normalised values
            pdl_prologue(USE_PDL)
            sum_sq = tl.zeros([1], tl.float32)
            for c in range(0, n_out, BLOCK):
                offs_n = c + tl.arange(0, BLOCK)
                n_ok = offs_n < n_out
                y = _finished_block(part_ptr, bias_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, out_dtype, HAS_BIAS, BLOCK)
                y32 = y.to(tl.float32)
                sum_sq += tl.sum(y32 * y32, axis=1)
            rstd = _rstd(sum_sq, n_out, eps)
            for c in range(0, n_out, BLOCK):
                offs_n = c + tl.arange(0, BLOCK)
                n_ok = offs_n < n_out
                y = _finished_block(part_ptr, bias_ptr, row, offs_n, n_ok, splits, stride_ps, stride_pm, out_dtype, HAS_BIAS, BLOCK)
                w, r = _row_inputs(norm_w_ptr, res_ptr, row, offs_n, n_ok, stride_rm, stride_rn, HAS_RESIDUAL)
                _store_normed(y, rstd, w, r, out_ptr, row, offs_n, n_ok, stride_om, UNIT_OFFSET, HAS_RESIDUAL)


__all__ = ["ACT_CODES"]
