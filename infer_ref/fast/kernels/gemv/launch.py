"""Launching the decode matrix-vector kernels: the kernel-only checks, the launch of a checked
:class:`~infer_ref.fast.kernels.gemv.reference.GemvCall` (the main kernel, then a combine kernel where
split K or out_norm needs one), and the kernels' entry points :func:`linear_triton` and
:func:`gated_mlp_triton` (CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``).

Checks are host-side metadata only and buffers are sized by shapes alone, so a launch can be
captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.common import HAVE_TRITON, KERNEL_DTYPES, device_profile, pdl_options
from infer_ref.fast.kernels.gemv.kernel import ACT_CODES
from infer_ref.fast.kernels.gemv.reference import GemvCall
from infer_ref.fast.kernels.gemv.tuning import PATHS, GemvConfig, gemv_config, prefetched_tiles, split_plan

if HAVE_TRITON:
    import triton

    from infer_ref.fast.kernels.gemv.kernel import _combine_kernel, _combine_norm_kernel, _gemv_kernel

# Rows (batch x tokens) the kernels take. Decode is 1 row per sequence; 8 covers small batches and
# short speculative verify steps. The dot paths pad rows to 16 anyway (the smallest tl.dot tile),
# so the bound is set by the multiply-and-add path's [rows, BLOCK_N, BLOCK_K] accumulator, whose
# registers grow with the padded row count.
MAX_ROWS = 8
COMBINE_BLOCK = 256  # columns per program of the split-K combine kernel
# Columns the out_norm combine holds at once: a row up to this wide is finished, squared and
# normalised from registers; a wider one is walked twice (squares, then normalise), its partials
# summed again in the same order (so to the same values) on the second walk.
OUT_NORM_BLOCK = 4096
# Columns of one load of in_norm's sum-of-squares pass (one row at a time): a 1B model's whole
# hidden row (2048 or 1152) in one load.
NORM_TILE_ELEMENTS = 8192
# Compile options of every launch here. No multiply-add contraction: the epilogues' roundings are
# eager torch's, and LLVM would narrow a float32 product rounded to bf16/fp16 into a 16-bit multiply
# and fuse it with the next add (a Llama-style norm's w * n rounded into the residual add: on an
# H100, 20% of out_norm outputs one ulp off). Each product of the matrix-vector sums is exact in
# float32 (16-bit operands), so the sums do not change either.
LAUNCH_OPTIONS: dict[str, Any] = {"enable_fp_fusion": False}


def check_kernel_args(x: Tensor, weight: Tensor, config: GemvConfig | None, what: str) -> int:
    """What only the kernel needs; returns the row count."""
    rows = math.prod(x.shape[:-1])
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"{what}: the kernel takes 1..{MAX_ROWS} rows (x's leading dims), got {rows}")
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{what}: the kernel takes {[str(d) for d in KERNEL_DTYPES]}, got {x.dtype}")
    if not weight.is_contiguous():
        raise ValueError(
            f"{what}: the kernel needs a row-major contiguous weight [N, K], got strides {weight.stride()}"
        )
    if weight.shape[1] == 0:
        raise ValueError(f"{what}: the kernel needs K >= 1, got weight {tuple(weight.shape)}")
    if config is not None and not isinstance(config, GemvConfig):
        raise TypeError(f"{what}: config must be a GemvConfig or None, got {type(config).__name__}")
    return rows


def launch(call: GemvCall, config: GemvConfig | None = None) -> Tensor:
    """Run the kernel(s) for a call its entry point has checked (:meth:`GemvCall.check`); returns
    ``call.out`` or a new ``[..., n_out]``. ``config`` None: :func:`gemv_config` for the device."""
    x, weight, bias, out = call.x, call.weight, call.bias, call.out
    in_norm, residual, out_norm, gated = call.in_norm, call.residual, call.out_norm, call.gated
    rows = check_kernel_args(x, weight, config, call.what)
    n, k = weight.shape
    if config is None:
        config = gemv_config(n, k, rows, gated=gated, device=device_profile(x.device))
    n_out = n // 2 if gated else n
    up_offset = n_out if gated else 0
    x2 = x.reshape(rows, k)  # a view when x's leading dims allow it, else a copy (sized by shape)
    if out is None:
        out = torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = out.view(rows, n_out)
    if n_out == 0:
        return out  # nothing to compute (and a grid of zero programs is not a launch)
    k_per_split, splits = split_plan(k, config.block_k, config.split_k)
    # tl.dot needs 16 rows at least (zero-padded); the multiply-and-add path pads to a power of two.
    rows_pad = triton.next_power_of_2(rows) if config.path == "fma" else max(16, triton.next_power_of_2(rows))
    # out_norm needs whole rows: the combine kernel does it, so the main kernel writes partials even
    # with one split. Partials hold gate and up columns side by side ([S, M, 2I]) for the gated kernel.
    partials = splits > 1 or out_norm is not None
    part = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device) if partials else out2
    # The kernels read the bias and norm weights with unit stride: a strided view is copied (by
    # shape: capturable). out2 stands in for an absent one (never read: its constexpr is off).
    bias_arg = bias.contiguous() if bias is not None else out2
    in_w = in_norm.weight.contiguous() if in_norm is not None else out2
    res2 = residual.reshape(rows, n_out) if residual is not None else out2  # a view of out if it is out
    norm_block = min(triton.next_power_of_2(k), NORM_TILE_ELEMENTS)
    pdl = pdl_options(x.device)
    pdl = {**pdl, **LAUNCH_OPTIONS}
    common: dict[str, Any] = {"GATED": gated, "ACT": ACT_CODES[call.act], "HAS_BIAS": bias is not None, **pdl}
    _gemv_kernel[(triton.cdiv(n_out, config.block_n), splits)](
        x2, weight, bias_arg, out2, part, in_w, res2,
        rows, n_out, k, k_per_split // config.block_k, up_offset, in_norm.eps if in_norm is not None else 0.0,
        x2.stride(0), x2.stride(1), out2.stride(0), part.stride(0) if partials else 0, part.stride(-2),
        res2.stride(0), res2.stride(1),
        ROWS_PAD=rows_pad, BLOCK_N=config.block_n, BLOCK_K=config.block_k, PATH=PATHS.index(config.path),
        EVEN_N=n_out % config.block_n == 0, EVEN_K=splits * k_per_split == k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        IN_NORM=in_norm is not None, UNIT_OFFSET=in_norm is not None and in_norm.unit_offset,
        NORM_ROWS=triton.next_power_of_2(rows), NORM_BLOCK=norm_block,
        HAS_RESIDUAL=residual is not None and not partials,
        PREFETCH_TILES=prefetched_tiles(config, k_per_split, call.weight_is_constant), WEIGHT_FIRST=config.weight_first,
        PREFETCH_RESIDUAL=residual is not None and call.residual_is_settled and not partials, WRITE_PARTIALS=partials, num_warps=config.num_warps, num_stages=config.num_stages, **common,
    )  # fmt: skip
    if out_norm is not None:
        block = min(triton.next_power_of_2(n_out), OUT_NORM_BLOCK)
        out_w = out_norm.weight.contiguous()
        _combine_norm_kernel[(rows,)](
            part, bias_arg, out2, out_w, res2,
            splits, n_out, out_norm.eps, part.stride(0), part.stride(1), out2.stride(0),
            res2.stride(0), res2.stride(1),
            BLOCK=block, ONE_BLOCK=n_out <= block, UNIT_OFFSET=out_norm.unit_offset, HAS_BIAS=bias is not None,
            HAS_RESIDUAL=residual is not None, num_warps=8 if block >= 2048 else 4, **pdl,
        )  # fmt: skip
    elif splits > 1:
        _combine_kernel[(triton.cdiv(n_out, COMBINE_BLOCK), rows)](
            part, bias_arg, out2, res2, splits, n_out, up_offset, part.stride(0), part.stride(1), out2.stride(0),
            res2.stride(0), res2.stride(1),
            BLOCK=COMBINE_BLOCK, HAS_RESIDUAL=residual is not None, num_warps=4, **common,
        )  # fmt: skip
    return out


@takes_arguments_of(GemvCall.for_linear)
def linear_triton(call: GemvCall, *, config: GemvConfig | None = None) -> Tensor:
    """The kernel for :func:`linear_reference` (``x [..., K]`` with 1..MAX_ROWS rows; CUDA, or CPU
    tensors under ``TRITON_INTERPRET=1``). ``config`` overrides :func:`gemv_config` (tests, sweeps);
    the other arguments are :func:`~infer_ref.fast.kernels.gemv.linear`'s."""
    call.check()
    return launch(call, config)


@takes_arguments_of(GemvCall.for_gated_mlp)
def gated_mlp_triton(call: GemvCall, *, config: GemvConfig | None = None) -> Tensor:
    """The kernel for :func:`gated_mlp_reference`; as :func:`linear_triton`."""
    call.check()
    return launch(call, config)


__all__ = [
    "COMBINE_BLOCK",
    "LAUNCH_OPTIONS",
    "MAX_ROWS",
    "NORM_TILE_ELEMENTS",
    "OUT_NORM_BLOCK",
    "check_kernel_args",
    "gated_mlp_triton",
    "launch",
    "linear_triton",
]
