"""The definitions of the decode matrix-vector products and the checks every call runs.

- :func:`linear_reference` ``(x, weight, bias, in_norm=, residual=, out_norm=)``:
  ``h = rms_norm(x, in_norm)`` over K, ``y = F.linear(h, weight, bias)``, ``y = rms_norm(y,
  out_norm)`` over N (the whole output row), ``y = residual + y``; each stage optional, the norms
  are :func:`infer_ref.norm.rms_norm` (the models' norm modules);
- :func:`gated_mlp_reference` ``(x, weight, act, in_norm=)``: ``weight`` ``[2I, K]`` stacks the gate
  rows then the up rows, and the result is ``act(g) * u`` with ``g, u = F.linear(h, weight).split(I,
  -1)``, ``h`` as above.

:class:`GemvCall` carries one call's arguments (what the kernels read and write, and the caller's
promises) from the entry points to the launch; :meth:`GemvCall.check` runs :func:`check_linear_args`
or :func:`check_gated_args`: host metadata only, no device synchronisation, everything checked
before anything runs.
"""

from __future__ import annotations

import dataclasses

import torch.nn.functional as F
from torch import Tensor

from infer_ref.activations import ACTIVATIONS
from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.common import overlap, same_view
from infer_ref.norm import NormSpec

# Rows (batch x tokens) the kernels take. Decode is 1 row per sequence; 8 covers small batches and
# short speculative verify steps. The dot paths pad rows to 16 anyway (the smallest tl.dot tile),


# -- references ----------------------------------------------------------------------------------


def linear_reference(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, in_norm: NormSpec | None = None,
    residual: Tensor | None = None, out_norm: NormSpec | None = None,
) -> Tensor:  # fmt: skip
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
    return gated_product(x if in_norm is None else in_norm(x), weight, act)


def gated_product(x: Tensor, weight: Tensor, act: str) -> Tensor:
    g, u = F.linear(x, weight).split(weight.shape[0] // 2, dim=-1)  # [..., I] each
    return ACTIVATIONS[act](g) * u


# -- one call's arguments ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GemvCall:
    """One product's arguments, as :func:`~infer_ref.fast.kernels.gemv.linear` or (``gated``)
    :func:`~infer_ref.fast.kernels.gemv.gated_mlp` (``act`` an :data:`ACTIVATIONS` name) takes them."""

    x: Tensor  # [..., K]
    weight: Tensor  # [N, K]; gated: [2I, K]
    bias: Tensor | None = None  # [N]
    out: Tensor | None = None  # [..., N] (gated: [..., I]) or None: a new tensor
    in_norm: NormSpec | None = None
    residual: Tensor | None = None  # [..., N]
    out_norm: NormSpec | None = None
    gated: bool = False
    act: str = "silu"  # the gated product's activation (unused by a linear call)
    weight_is_constant: bool = False
    residual_is_settled: bool = False

    @classmethod
    def for_linear(
        cls,
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
    ) -> GemvCall:
        """A linear call, from the arguments every linear entry point takes
        (:func:`~infer_ref.fast.kernels.gemv.linear` documents them)."""
        return cls(
            x, weight, bias, out, in_norm, residual, out_norm, weight_is_constant=weight_is_constant,
            residual_is_settled=residual_is_settled,
        )  # fmt: skip

    @classmethod
    def for_gated_mlp(
        cls, x: Tensor, weight: Tensor, act: str, *, out: Tensor | None = None, in_norm: NormSpec | None = None,
        weight_is_constant: bool = False,
    ) -> GemvCall:  # fmt: skip
        """A gated-MLP call, from the arguments every gated entry point takes."""
        return cls(x, weight, out=out, in_norm=in_norm, gated=True, act=act, weight_is_constant=weight_is_constant)

    @property
    def what(self) -> str:
        """The entry point's name, as the errors say it."""
        return "gated_mlp" if self.gated else "linear"

    def check(self) -> None:
        """The checks of the entry point this call is for (:func:`check_gated_args` or :func:`check_linear_args`)."""
        if self.gated:
            _check_gated(self)
        else:
            _check_linear(self)


# -- host checks (the references, the kernels' entry points and the dispatch all run them) ----------


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
    _check_like_x(weight, "weight", x, what, ": the product never converts")


def _check_like_x(t: Tensor, name: str, x: Tensor, what: str, why: str = "") -> None:
    """``t`` is in x's dtype (``why`` ends the error) and on x's device."""
    if t.dtype != x.dtype:
        raise TypeError(f"{what}: {name} has dtype {t.dtype}, x has {x.dtype}{why}")
    if t.device != x.device:
        raise ValueError(f"{what}: {name} is on {t.device}, x is on {x.device}")


def _check_norm(spec: NormSpec | None, name: str, dim: str, size: int, x: Tensor, what: str) -> None:
    """``spec`` normalises vectors of ``size`` (``dim`` names it: K or N) in x's dtype and device."""
    if spec is None:
        return
    if not isinstance(spec, NormSpec):
        raise TypeError(f"{what}: {name} must be a NormSpec or None, got {type(spec).__name__}")
    w = spec.weight
    if tuple(w.shape) != (size,):
        raise ValueError(f"{what}: {name}.weight must be [{dim}={size}], got {tuple(w.shape)}")
    _check_like_x(w, f"{name}.weight", x, what, ": the norm runs in x's dtype")


def _check_row_output(t: object, name: str, width: str, x: Tensor, n_out: int, what: str) -> None:
    """``t`` (``out`` or ``residual``: shaped like the product's result) is a ``[..., n_out]`` tensor
    (``width`` names the last dim) in x's dtype and on its device."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: {name} must be a tensor or None, got {type(t).__name__}")
    want = (*x.shape[:-1], n_out)
    if tuple(t.shape) != want:
        raise ValueError(f"{what}: {name} must be {want} (x's leading dims, then {width}), got {tuple(t.shape)}")
    _check_like_x(t, name, x, what)


def _check_out(out: Tensor | None, x: Tensor, n_out: int, reads: dict[str, Tensor | None], what: str) -> None:
    """``out`` ``[..., n_out]``, x's dtype and device, contiguous, sharing no memory with what the
    kernels read (``reads``, by name; a residual that is ``out`` itself is checked elsewhere)."""
    if out is None:
        return
    _check_row_output(out, "out", "the output width", x, n_out, what)
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
    _check_row_output(residual, "residual", "N", x, n_out, what)
    if out is not None and overlap(out, residual) and not same_view(out, residual):
        raise ValueError(
            f"{what}: residual overlaps out without being the same view (out may be the residual "
            f"itself, for an in-place update, but no other overlap is allowed)"
        )


def _check_flag(value: object, name: str, what: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be a bool, got {value!r}")


def _check_linear(call: GemvCall) -> None:
    """Shapes, dtypes and devices of a linear call (host metadata only: no device synchronisation).

    Everything is checked before anything runs, so a refused call leaves ``out`` untouched.
    """
    x, weight, bias, out, in_norm, residual, out_norm = (
        call.x, call.weight, call.bias, call.out, call.in_norm, call.residual, call.out_norm
    )  # fmt: skip
    weight_is_constant, residual_is_settled = call.weight_is_constant, call.residual_is_settled
    _check_common(x, weight, "linear")
    n, k = weight.shape
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"linear: bias must be a tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"linear: bias must be [N={n}], got {tuple(bias.shape)}")
        _check_like_x(bias, "bias", x, "linear")
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


def _check_gated(call: GemvCall) -> None:
    """Shapes, dtypes, devices and the activation name of a gated-MLP call (host metadata only)."""
    x, weight, act, out, in_norm = call.x, call.weight, call.act, call.out, call.in_norm
    weight_is_constant = call.weight_is_constant
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




@takes_arguments_of(GemvCall.for_linear)
def check_linear_args(call: GemvCall) -> None:
    """:meth:`GemvCall.check` of a linear call, taking :func:`~infer_ref.fast.kernels.gemv.linear`'s arguments."""
    call.check()


@takes_arguments_of(GemvCall.for_gated_mlp)
def check_gated_args(call: GemvCall) -> None:
    """:meth:`GemvCall.check` of a gated-MLP call, taking :func:`~infer_ref.fast.kernels.gemv.gated_mlp`'s arguments."""
    call.check()


__all__ = [
    "ACTIVATIONS",
    "GemvCall",
    "check_gated_args",
    "check_linear_args",
    "gated_mlp_reference",
    "gated_product",
    "linear_reference",
]
