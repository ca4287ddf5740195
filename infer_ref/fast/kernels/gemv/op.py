"""The dispatching entry points of the decode matrix-vector products and their custom ops.

:func:`linear` and :func:`gated_mlp` run the kernel when ``x`` is on CUDA, Triton is importable,
the dtype is bf16/fp16/fp32, the rows fit (``1..MAX_ROWS``), the weight is contiguous and the
decode kernels are switched on (:mod:`infer_ref.fast.switch`); the reference otherwise. Under
``torch.compile`` a kernel call is one custom op per operation (``infer_ref::gemv_linear``,
``infer_ref::gemv_gated_mlp``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.common import HAVE_TRITON, KERNEL_DTYPES
from infer_ref.fast.kernels.gemv.launch import MAX_ROWS, gated_mlp_triton, linear_triton
from infer_ref.fast.kernels.gemv.reference import GemvCall, gated_product, linear_reference
from infer_ref.fast.kernels.gemv.tuning import CUBLAS_SHAPES
from infer_ref.fast.switch import decode_kernels_enabled
from infer_ref.norm import NormSpec


def _kernel_eligible(x: Tensor, weight: Tensor) -> bool:
    rows = math.prod(x.shape[:-1])
    return (
        HAVE_TRITON
        and decode_kernels_enabled()
        and x.is_cuda
        and x.dtype in KERNEL_DTYPES
        and 1 <= rows <= MAX_ROWS
        and weight.is_contiguous()
        and weight.shape[1] > 0
    )


@takes_arguments_of(GemvCall.for_linear)
def linear(call: GemvCall) -> Tensor:
    """:func:`linear_reference`'s contract, dispatching to the kernel where it applies (module docstring).

    ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` -> ``[..., N]``. ``in_norm``: an RMSNorm over K
    applied to x first (weight ``[K]``); ``out_norm``: one over N applied to the product (weight
    ``[N]``); ``residual [..., N]``: added last. Everything in x's dtype and on its device.
    ``out``: write the result there (shape ``[..., N]``, contiguous, sharing no memory with the
    inputs; it may be ``residual`` itself, for an in-place residual update).
    ``weight_is_constant``: promise that no earlier kernel on the stream writes ``weight`` (true of
    a model's parameters during decode), so the kernel may start reading it before its predecessor
    finishes. ``residual_is_settled``: promise that the residual was written before the kernel
    launched just before this call (true of a block's residual stream in a decode step), so the
    kernel may read it before its predecessor finishes too; needs a residual.
    """
    call.check()
    x, weight, bias, out, in_norm, residual, out_norm = (
        call.x, call.weight, call.bias, call.out, call.in_norm, call.residual, call.out_norm
    )  # fmt: skip
    # CUBLAS_SHAPES is about a plain product whose input norm runs elsewhere (tuning.py).
    plain_cublas = in_norm is None and tuple(weight.shape) in CUBLAS_SHAPES
    if _kernel_eligible(x, weight) and not plain_cublas:
        if out is None:  # through the custom op: one opaque node under torch.compile
            return torch.ops.infer_ref.gemv_linear(
                x, weight, bias, *_flat_norm(in_norm), residual, *_flat_norm(out_norm), call.weight_is_constant,
                call.residual_is_settled,
            )  # fmt: skip
        return linear_triton(
            x, weight, bias, out=out, in_norm=in_norm, residual=residual, out_norm=out_norm,
            weight_is_constant=call.weight_is_constant, residual_is_settled=call.residual_is_settled,
        )  # fmt: skip
    y = linear_reference(x, weight, bias, in_norm=in_norm, residual=residual, out_norm=out_norm)
    return y if out is None else out.copy_(y)


@takes_arguments_of(GemvCall.for_gated_mlp)
def gated_mlp(call: GemvCall) -> Tensor:
    """:func:`gated_mlp_reference`'s contract, dispatching to the kernel where it applies.

    ``x [..., K]``, ``weight [2I, K]`` -> ``[..., I]``; ``in_norm``, ``out`` and
    ``weight_is_constant`` as in :func:`linear`.
    """
    call.check()
    x, weight, act, out, in_norm = call.x, call.weight, call.act, call.out, call.in_norm
    if _kernel_eligible(x, weight):
        if out is None:
            return torch.ops.infer_ref.gemv_gated_mlp(x, weight, act, *_flat_norm(in_norm), call.weight_is_constant)
        return gated_mlp_triton(x, weight, act, out=out, in_norm=in_norm, weight_is_constant=call.weight_is_constant)
    y = gated_product(x if in_norm is None else in_norm(x), weight, act)  # the reference, already checked
    return y if out is None else out.copy_(y)


# -- custom ops ------------------------------------------------------------------------------------
# torch.compile sees each call as one opaque node: Inductor neither re-lays out the kernel's inputs
# nor launches the kernel itself, so the launch keeps its options (programmatic dependent launch,
# infer_ref/fast/kernels/common.py) and its tuned configuration. A custom op cannot take a NormSpec: each
# norm travels as (weight or None, eps, unit_offset).


def _flat_norm(spec: NormSpec | None) -> tuple[Tensor | None, float, bool]:
    return (None, 0.0, False) if spec is None else (spec.weight, float(spec.eps), spec.unit_offset)


def _norm_of(weight: Tensor | None, eps: float, unit_offset: bool) -> NormSpec | None:
    return None if weight is None else NormSpec(weight, eps, unit_offset)


@torch.library.custom_op("infer_ref::gemv_linear", mutates_args=())
def _linear_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    in_norm_weight: Tensor | None = None,
    in_norm_eps: float = 0.0,
    in_norm_unit_offset: bool = False,
    residual: Tensor | None = None,
    out_norm_weight: Tensor | None = None,
    out_norm_eps: float = 0.0,
    out_norm_unit_offset: bool = False,
    weight_is_constant: bool = False,
    residual_is_settled: bool = False,
) -> Tensor:
    return linear_triton(
        x, weight, bias, in_norm=_norm_of(in_norm_weight, in_norm_eps, in_norm_unit_offset), residual=residual,
        out_norm=_norm_of(out_norm_weight, out_norm_eps, out_norm_unit_offset), weight_is_constant=weight_is_constant,
        residual_is_settled=residual_is_settled,
    )  # fmt: skip


@_linear_op.register_fake
def _linear_fake(x: Tensor, weight: Tensor, *args: object, **kwargs: object) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("infer_ref::gemv_gated_mlp", mutates_args=())
def _gated_op(
    x: Tensor,
    weight: Tensor,
    act: str,
    in_norm_weight: Tensor | None = None,
    in_norm_eps: float = 0.0,
    in_norm_unit_offset: bool = False,
    weight_is_constant: bool = False,
) -> Tensor:
    return gated_mlp_triton(
        x, weight, act, in_norm=_norm_of(in_norm_weight, in_norm_eps, in_norm_unit_offset),
        weight_is_constant=weight_is_constant,
    )  # fmt: skip


@_gated_op.register_fake
def _gated_fake(x: Tensor, weight: Tensor, *args: object, **kwargs: object) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


__all__ = ["gated_mlp", "linear"]
