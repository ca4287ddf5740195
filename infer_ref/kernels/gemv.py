"""Matrix-vector products for the decode step: a linear layer and the gated MLP's first half, with
the RMSNorms and the residual add around them folded in.

A decode step multiplies a handful of rows (batch x tokens, usually 1) by each weight matrix, so
it is bound by reading the weights: the work is a GEMV, and cuBLAS reaches well under the copy
bandwidth on the small projections of a 1B model. These kernels read each weight once with enough
programs in flight to saturate HBM.

The definitions (each step rounds to x's dtype exactly where eager torch rounds):

- :func:`linear_reference` ``(x, weight, bias, in_norm=, residual=, out_norm=)``:
  ``h = rms_norm(x, in_norm)`` over K, ``y = F.linear(h, weight, bias)``, ``y = rms_norm(y,
  out_norm)`` over N (the whole output row), ``y = residual + y``; each stage optional, the norms
  are :func:`infer_ref.norm.rms_norm` (the models' norm modules). This is a transformer
  block around its projections: Llama/Qwen ``x + o_proj(attn)`` (residual) and ``gate_up(norm(x))``
  (in_norm), Gemma ``x + post_norm(o_proj(attn))`` (out_norm and residual);
- :func:`gated_mlp_reference` ``(x, weight, act, in_norm=)``: ``weight`` ``[2I, K]`` stacks the gate
  rows then the up rows, and the result is ``act(g) * u`` with ``g, u = F.linear(h, weight).split(I,
  -1)``, ``h`` as above.

The Triton kernel computes ``x [M, K] @ weight[N, K]^T`` in float32 for ``M <= MAX_ROWS`` rows. A
program owns ``BLOCK_N`` output columns and one of ``SPLIT_K`` slices of K; it walks its slice in
``BLOCK_K`` tiles along one of three paths: ``"dot"``, ``tl.dot(x, W^T)`` with the rows padded to
16 (the weight tile pipelined through shared memory over ``num_stages``); ``"dot_t"``, the same
product transposed, ``tl.dot(W, x^T)``, so the weight block is the MMA's M side (the "swap AB" of
small-batch GEMMs: tensor cores prefer many rows there); ``"fma"``, a multiply-and-add into a
``[M, BLOCK_N, BLOCK_K]`` float32 accumulator reduced once at the end (the classic GEMV form). When
K and N divide into whole tiles and blocks, weight loads carry no masks. With one split the
program finishes the output itself; with several, each writes float32 partials ``[SPLIT_K, M, N]``
and a second kernel sums them in split order (deterministic: no atomics) and finishes. Finishing
means: add the bias, round to x's dtype; for the gated variant, where a program owns gate rows
``j`` and up rows ``I + j`` together, round ``g`` and ``u`` to the dtype, compute the activation in
float32 from the rounded ``g`` and round it, multiply the two rounded values in float32 and round —
the roundings eager torch does in bf16, so the kernel differs from the reference only by the order
of the sums (the dot products', and the norms' sums of squares).

The fused stages:

- ``in_norm`` (prologue, every path, any row count): each program first sums the squares of its
  rows of x over ALL of K (also with split K: a slice's own sum would be another norm), then
  normalises each x tile as it loads it: Llama's ``round(w * round(x32 * rstd))`` or Gemma's
  ``round(x32 * rstd * (1 + w32))``, ``rstd = 1 / sqrt(mean(x32^2) + eps)`` per row. Reading x
  twice costs little: it is a few KB, resident in L2 after the first program.
- ``out_norm`` needs every column of a row, so it runs in a combine kernel whose program owns whole
  rows; the main kernel then always writes float32 partials (even with one split). The combine
  sums them in split order, finishes (bias, rounding), sums the squares of the rounded row and
  normalises it.
- ``residual`` ``[..., N]``: ``round(residual32 + round(y))``, last, in whichever kernel finishes
  the output (the main kernel with one split and no out_norm, else the combine).
- ``weight_is_constant``: no earlier kernel of the stream writes the weight, so the program may
  issue its first weight tile's loads before its programmatic-dependent-launch wait
  (``infer_ref/kernels/pdl.py`` allows loads of constant data there): the first K tile is peeled
  off the loop, loaded before ``pdl_prologue`` and consumed after it, and the weight stream
  overlaps the predecessor's tail. A public call cannot know this, so it is off by default.
- ``residual_is_settled``: the residual was written before the kernel launched just before this
  call (a block's residual stream in a decode step: the sub-layer's own kernels run in between),
  so the program may load its residual tile before its dependency wait too, and the epilogue
  needs no round trip of its own. Off by default, for the same reason. (A combine kernel loads the
  residual and the out_norm weight before its wait in any case: its predecessor is the call's own
  product, which writes only partials.)

:func:`linear` and :func:`gated_mlp` dispatch: the kernel when ``x`` is on CUDA, Triton is
importable, the dtype is bf16/fp16/fp32, the rows fit (``1..MAX_ROWS``), the weight is contiguous
and the decode kernels are switched on (:mod:`infer_ref.fast.switch`); the reference otherwise.
Checks are host-side metadata only and buffers are sized by shapes alone, so a call can be
captured in a CUDA graph. Launch configurations live in :mod:`infer_ref.kernels.gemv_config`
(re-exported here), the Triton kernels and their launch in :mod:`infer_ref.kernels.gemv_kernels`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.activations import ACTIVATIONS
from infer_ref.fast.switch import decode_kernels_enabled
from infer_ref.kernels.gemv_config import (
    CUBLAS_SHAPES,
    GATED_CONFIGS,
    LINEAR_CONFIGS,
    PATHS,
    TABLE_ROWS,
    TARGET_PROGRAMS,
    FusedStages,
    GemvConfig,
    decode_projections,
    decode_stages,
    default_config,
    gemv_config,
    split_plan,
)
from infer_ref.kernels.gemv_kernels import HAVE_TRITON, launch
from infer_ref.memory import overlap
from infer_ref.norm import NormSpec

# Rows (batch x tokens) the kernels take. Decode is 1 row per sequence; 8 covers small batches and
# short speculative verify steps. The dot paths pad rows to 16 anyway (the smallest tl.dot tile),
# so the bound is set by the multiply-and-add path's [rows, BLOCK_N, BLOCK_K] accumulator, whose
# registers grow with the padded row count.
MAX_ROWS = 8
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# -- references ----------------------------------------------------------------------------------


def linear_reference(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    in_norm: NormSpec | None = None,
    residual: Tensor | None = None,
    out_norm: NormSpec | None = None,
) -> Tensor:
    """The definition: ``residual + out_norm(F.linear(in_norm(x), weight, bias))``, each stage optional.

    ``x [..., K]``, ``weight [N, K]``, ``bias [N]``, ``in_norm`` over K, ``out_norm`` over N,
    ``residual [..., N]`` -> ``[..., N]``; the eager ops of the models, rounding where they round.
    """
    h = x if in_norm is None else in_norm(x)
    y = F.linear(h, weight, bias)
    if out_norm is not None:
        y = out_norm(y)
    return y if residual is None else residual + y


def gated_mlp_reference(x: Tensor, weight: Tensor, act: str, *, in_norm: NormSpec | None = None) -> Tensor:
    """The definition: ``act(g) * u`` where ``g, u = F.linear(in_norm(x), weight).split(I, -1)``.

    ``weight`` is ``[2I, K]``: gate rows ``0..I-1`` then up rows ``I..2I-1``; the result is ``[..., I]``.
    """
    check_gated_args(x, weight, act, in_norm=in_norm)
    return _gated_product(x if in_norm is None else in_norm(x), weight, act)


def _gated_product(x: Tensor, weight: Tensor, act: str) -> Tensor:
    g, u = F.linear(x, weight).split(weight.shape[0] // 2, dim=-1)  # [..., I] each
    return ACTIVATIONS[act](g) * u


# -- host checks ---------------------------------------------------------------------------------


def _check_common(x: Tensor, weight: Tensor, what: str) -> None:
    if not isinstance(x, Tensor) or not isinstance(weight, Tensor):
        raise TypeError(
            f"{what}: x and weight must be tensors, got {type(x).__name__} and {type(weight).__name__}"
        )
    if weight.dim() != 2:
        raise ValueError(f"{what}: weight must be [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{what}: x must be [..., K={weight.shape[1]}] to match weight {tuple(weight.shape)}, got {tuple(x.shape)}"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"{what}: x must be a floating-point tensor, got {x.dtype}")
    if weight.dtype != x.dtype:
        raise TypeError(
            f"{what}: weight has dtype {weight.dtype}, x has {x.dtype}: the product never converts"
        )
    if weight.device != x.device:
        raise ValueError(f"{what}: weight is on {weight.device}, x is on {x.device}")


def _check_norm(spec: NormSpec | None, name: str, dim: str, size: int, x: Tensor, what: str) -> None:
    """``spec`` normalises vectors of ``size`` (``dim`` names it: K or N) in x's dtype and device."""
    if spec is None:
        return
    if not isinstance(spec, NormSpec):
        raise TypeError(f"{what}: {name} must be a NormSpec or None, got {type(spec).__name__}")
    w = spec.weight
    if tuple(w.shape) != (size,):
        raise ValueError(f"{what}: {name}.weight must be [{dim}={size}], got {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise TypeError(
            f"{what}: {name}.weight has dtype {w.dtype}, x has {x.dtype}: the norm runs in x's dtype"
        )
    if w.device != x.device:
        raise ValueError(f"{what}: {name}.weight is on {w.device}, x is on {x.device}")


def _same_view(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` address the same elements in the same order (one tensor, or two equal views)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
    )


def _check_out(out: Tensor | None, x: Tensor, n_out: int, reads: dict[str, Tensor | None], what: str) -> None:
    """``out`` ``[..., n_out]``, x's dtype and device, contiguous, sharing no memory with what the
    kernels read (``reads``, by name; a residual that is ``out`` itself is checked elsewhere)."""
    if out is None:
        return
    want = (*x.shape[:-1], n_out)
    if not isinstance(out, Tensor):
        raise TypeError(f"{what}: out must be a tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != want:
        raise ValueError(
            f"{what}: out must be {want} (x's leading dims, then the output width), got {tuple(out.shape)}"
        )
    if out.dtype != x.dtype:
        raise TypeError(f"{what}: out has dtype {out.dtype}, x has {x.dtype}")
    if out.device != x.device:
        raise ValueError(f"{what}: out is on {out.device}, x is on {x.device}")
    if not out.is_contiguous():
        raise ValueError(
            f"{what}: out must be contiguous, got strides {out.stride()} for shape {tuple(out.shape)}"
        )
    for name, t in (("x", x), *reads.items()):
        if t is not None and overlap(out, t):
            raise ValueError(f"{what}: out shares memory with {name}: the kernel would read what it writes")


def _check_residual(residual: Tensor | None, x: Tensor, n_out: int, out: Tensor | None, what: str) -> None:
    """``residual`` ``[..., N]`` like the output; it may be ``out`` itself (an in-place residual
    update: each element is read before it is written, by the program that writes it) but may not
    overlap ``out`` in any other way (a program would read what another one wrote)."""
    if residual is None:
        return
    if not isinstance(residual, Tensor):
        raise TypeError(f"{what}: residual must be a tensor or None, got {type(residual).__name__}")
    want = (*x.shape[:-1], n_out)
    if tuple(residual.shape) != want:
        raise ValueError(
            f"{what}: residual must be {want} (x's leading dims, then N), got {tuple(residual.shape)}"
        )
    if residual.dtype != x.dtype:
        raise TypeError(f"{what}: residual has dtype {residual.dtype}, x has {x.dtype}")
    if residual.device != x.device:
        raise ValueError(f"{what}: residual is on {residual.device}, x is on {x.device}")
    if out is not None and overlap(out, residual) and not _same_view(out, residual):
        raise ValueError(
            f"{what}: residual overlaps out without being the same view (out may be the residual "
            f"itself, for an in-place update, but no other overlap is allowed)"
        )


def _check_flag(value: object, name: str, what: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be a bool, got {value!r}")


def check_linear_args(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    out: Tensor | None = None,
    *,
    in_norm: NormSpec | None = None,
    residual: Tensor | None = None,
    out_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
    residual_is_settled: bool = False,
) -> None:
    """Shapes, dtypes and devices of a linear call (host metadata only: no device synchronisation).

    Everything is checked before anything runs, so a refused call leaves ``out`` untouched.
    """
    _check_common(x, weight, "linear")
    n, k = weight.shape
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"linear: bias must be a tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"linear: bias must be [N={n}], got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"linear: bias has dtype {bias.dtype}, x has {x.dtype}")
        if bias.device != x.device:
            raise ValueError(f"linear: bias is on {bias.device}, x is on {x.device}")
    _check_norm(in_norm, "in_norm", "K", k, x, "linear")
    _check_norm(out_norm, "out_norm", "N", n, x, "linear")
    _check_residual(residual, x, n, out, "linear")
    _check_flag(weight_is_constant, "weight_is_constant", "linear")
    _check_flag(residual_is_settled, "residual_is_settled", "linear")
    if residual_is_settled and residual is None:
        raise ValueError("linear: residual_is_settled=True is a promise about the residual, but no residual was given")
    reads = {
        "weight": weight,
        "bias": bias,
        "in_norm.weight": None if in_norm is None else in_norm.weight,
        "out_norm.weight": None if out_norm is None else out_norm.weight,
    }
    _check_out(out, x, n, reads, "linear")


def check_gated_args(
    x: Tensor,
    weight: Tensor,
    act: str,
    out: Tensor | None = None,
    *,
    in_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
) -> None:
    """Shapes, dtypes, devices and the activation name of a gated-MLP call (host metadata only)."""
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"gated_mlp: unknown activation {act!r}: expected one of {sorted(ACTIVATIONS)}")
    _check_common(x, weight, "gated_mlp")
    if weight.shape[0] == 0 or weight.shape[0] % 2:
        raise ValueError(
            f"gated_mlp: weight must be [2I, K] (gate rows then up rows), got {weight.shape[0]} rows: not a positive even count"
        )
    _check_norm(in_norm, "in_norm", "K", weight.shape[1], x, "gated_mlp")
    _check_flag(weight_is_constant, "weight_is_constant", "gated_mlp")
    reads = {"weight": weight, "in_norm.weight": None if in_norm is None else in_norm.weight}
    _check_out(out, x, weight.shape[0] // 2, reads, "gated_mlp")


def _check_kernel_args(x: Tensor, weight: Tensor, config: GemvConfig | None, what: str) -> int:
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


def linear_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    in_norm: NormSpec | None = None,
    residual: Tensor | None = None,
    out_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
    residual_is_settled: bool = False,
    config: GemvConfig | None = None,
) -> Tensor:
    """The kernel for :func:`linear_reference` (``x [..., K]`` with 1..MAX_ROWS rows; CUDA, or CPU
    tensors under ``TRITON_INTERPRET=1``). ``config`` overrides :func:`gemv_config` (tests, sweeps);
    the other arguments are :func:`linear`'s."""
    check_linear_args(
        x, weight, bias, out, in_norm=in_norm, residual=residual, out_norm=out_norm,
        weight_is_constant=weight_is_constant, residual_is_settled=residual_is_settled,
    )  # fmt: skip
    rows = _check_kernel_args(x, weight, config, "linear")
    if config is None:
        config = gemv_config(weight.shape[0], weight.shape[1], rows)
    return launch(
        x, weight, bias, out, config, rows, gated=False, act="silu", in_norm=in_norm, residual=residual,
        out_norm=out_norm, weight_is_constant=weight_is_constant, residual_is_settled=residual_is_settled,
    )  # fmt: skip


def gated_mlp_triton(
    x: Tensor,
    weight: Tensor,
    act: str,
    *,
    out: Tensor | None = None,
    in_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
    config: GemvConfig | None = None,
) -> Tensor:
    """The kernel for :func:`gated_mlp_reference`; as :func:`linear_triton`."""
    check_gated_args(x, weight, act, out, in_norm=in_norm, weight_is_constant=weight_is_constant)
    rows = _check_kernel_args(x, weight, config, "gated_mlp")
    if config is None:
        config = gemv_config(weight.shape[0], weight.shape[1], rows, gated=True)
    return launch(
        x, weight, None, out, config, rows, gated=True, act=act, in_norm=in_norm, residual=None,
        out_norm=None, weight_is_constant=weight_is_constant,
    )  # fmt: skip


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    in_norm: NormSpec | None = None,
    residual: Tensor | None = None,
    out_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
    residual_is_settled: bool = False,
) -> Tensor:
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
    check_linear_args(
        x, weight, bias, out, in_norm=in_norm, residual=residual, out_norm=out_norm,
        weight_is_constant=weight_is_constant, residual_is_settled=residual_is_settled,
    )  # fmt: skip
    # CUBLAS_SHAPES is about a plain product whose input norm runs elsewhere (gemv_config.py).
    plain_cublas = in_norm is None and tuple(weight.shape) in CUBLAS_SHAPES
    if _kernel_eligible(x, weight) and not plain_cublas:
        if out is None:  # through the custom op: one opaque node under torch.compile
            return torch.ops.infer_ref.gemv_linear(
                x, weight, bias, *_flat_norm(in_norm), residual, *_flat_norm(out_norm), weight_is_constant,
                residual_is_settled,
            )  # fmt: skip
        return linear_triton(
            x, weight, bias, out=out, in_norm=in_norm, residual=residual, out_norm=out_norm,
            weight_is_constant=weight_is_constant, residual_is_settled=residual_is_settled,
        )  # fmt: skip
    y = linear_reference(x, weight, bias, in_norm=in_norm, residual=residual, out_norm=out_norm)
    return y if out is None else out.copy_(y)


def gated_mlp(
    x: Tensor,
    weight: Tensor,
    act: str,
    *,
    out: Tensor | None = None,
    in_norm: NormSpec | None = None,
    weight_is_constant: bool = False,
) -> Tensor:
    """:func:`gated_mlp_reference`'s contract, dispatching to the kernel where it applies.

    ``x [..., K]``, ``weight [2I, K]`` -> ``[..., I]``; ``in_norm``, ``out`` and
    ``weight_is_constant`` as in :func:`linear`.
    """
    check_gated_args(x, weight, act, out, in_norm=in_norm, weight_is_constant=weight_is_constant)
    if _kernel_eligible(x, weight):
        if out is None:
            return torch.ops.infer_ref.gemv_gated_mlp(
                x, weight, act, *_flat_norm(in_norm), weight_is_constant
            )
        return gated_mlp_triton(
            x, weight, act, out=out, in_norm=in_norm, weight_is_constant=weight_is_constant
        )
    y = _gated_product(x if in_norm is None else in_norm(x), weight, act)  # the reference, already checked
    return y if out is None else out.copy_(y)


# -- custom ops ------------------------------------------------------------------------------------
# torch.compile sees each call as one opaque node: Inductor neither re-lays out the kernel's inputs
# nor launches the kernel itself, so the launch keeps its options (programmatic dependent launch,
# infer_ref/kernels/pdl.py) and its tuned configuration. A custom op cannot take a NormSpec: each
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


__all__ = [
    "ACTIVATIONS",
    "CUBLAS_SHAPES",
    "GATED_CONFIGS",
    "LINEAR_CONFIGS",
    "MAX_ROWS",
    "PATHS",
    "TABLE_ROWS",
    "TARGET_PROGRAMS",
    "FusedStages",
    "GemvConfig",
    "NormSpec",
    "check_gated_args",
    "check_linear_args",
    "decode_projections",
    "decode_stages",
    "default_config",
    "gated_mlp",
    "gated_mlp_reference",
    "gated_mlp_triton",
    "gemv_config",
    "linear",
    "linear_reference",
    "linear_triton",
    "split_plan",
]
