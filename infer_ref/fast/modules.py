"""Kernel-backed projection, MLP and attention modules, and the swap that puts them into a model.

The reference modules (``infer_ref/models/common.py``) compute with eager torch only. Here each
gets a subclass that adds the fast path's kernels and otherwise falls back to the reference code
itself (``super().forward``):

- :class:`KernelLinear` / :class:`KernelPackedLinear`: while the decode kernels are switched on
  (``switch.py`` says why only in a captured step), :func:`infer_ref.fast.kernels.gemv.linear` computes
  ``residual + out_norm(in_norm(x) @ W^T + b)`` in one matrix-vector kernel;
- :class:`KernelMLP`: ``act(gate) * up`` in one gated matrix-vector kernel, under the same switch;
- :class:`~infer_ref.fast.attention.FastAttention`: the fused decode step and the paged decode
  kernel (``attention.py``).

**The swap.** :func:`use_fast_modules` replaces the class of each reference module of a model by
its subclass (``module.__class__ = ...``). Parameters, buffers, hooks and the state dict stay as
they are (the subclass adds no state), so the model is the same object for every other holder; a
swapped module computes what the reference computes wherever its kernels do not apply (the
switch off, another device, another cache), and where they do, what the kernels are tested to
compute against the reference. Only exact reference types are swapped: a subclass someone else
defined, or an instance whose ``forward`` was patched, keeps its own code. It is idempotent.
A class swap (rather than wrapping modules or a flag read by the reference) keeps the reference
free of any kernel import and keeps ``torch.compile`` tracing plain module methods.
"""

from __future__ import annotations

from typing import TypeVar

from torch import Tensor, nn

from infer_ref.fast.attention import FastAttention
from infer_ref.fast.kernels import gemv
from infer_ref.fast.switch import decode_kernels_enabled
from infer_ref.models.common import (
    MLP,
    Attention,
    DecodeLinear,
    Normed,
    PackedLinear,
    ProjectionInput,
    RMSNorm,
)
from infer_ref.norm import NormSpec


def _raw_input(x: ProjectionInput) -> tuple[Tensor, NormSpec | None]:
    """The tensor a projection reads and the norm its kernel applies on the way in (None: none)."""
    if isinstance(x, Normed):
        return x.x, x.norm.spec
    return x, None


class KernelLinear(DecodeLinear):
    """:class:`DecodeLinear` through :func:`infer_ref.fast.kernels.gemv.linear` while the decode kernels are on."""

    def forward(
        self, x: ProjectionInput, *, residual: Tensor | None = None, out_norm: RMSNorm | None = None
    ) -> Tensor:
        if not decode_kernels_enabled():  # the eager path: F.linear without the kernel's argument checks
            return super().forward(x, residual=residual, out_norm=out_norm)
        raw, in_norm = _raw_input(x)
        # Both promises hold in a decode step: the weights are parameters, and the residual is the
        # block's stream, written before the sub-layer's own kernels (qkv and attention, or gate_up)
        # that run between its write and this projection.
        return gemv.linear(
            raw, self.weight, self.bias, in_norm=in_norm, residual=residual,
            out_norm=None if out_norm is None else out_norm.spec, weight_is_constant=True,
            residual_is_settled=residual is not None,
        )  # fmt: skip


class KernelPackedLinear(KernelLinear, PackedLinear):
    """A :class:`PackedLinear` with the matrix-vector kernel (see :class:`KernelLinear`)."""


class KernelMLP(MLP):
    """:class:`MLP` whose ``act(gate(x)) * up(x)`` is one gated matrix-vector kernel while the decode
    kernels are on (and the projection has no bias, which the kernel does not take)."""

    def gated(self, x: ProjectionInput) -> Tensor:
        if self.gate_up_proj.bias is None and decode_kernels_enabled():
            raw, in_norm = _raw_input(x)
            return gemv.gated_mlp(raw, self.gate_up_proj.weight, self.act_name, in_norm=in_norm, weight_is_constant=True)
        return super().gated(x)  # [B, T, I]


# Each reference class and the kernel-backed class that replaces it (exact types only).
FAST_CLASSES: dict[type[nn.Module], type[nn.Module]] = {
    DecodeLinear: KernelLinear,
    PackedLinear: KernelPackedLinear,
    MLP: KernelMLP,
    Attention: FastAttention,
}


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def use_fast_modules(model: ModuleT) -> ModuleT:
    """Swap the kernel-backed classes into ``model`` in place (idempotent); returns ``model``."""
    for module in model.modules():
        fast = FAST_CLASSES.get(type(module))
        if fast is not None:
            module.__class__ = fast
    return model


__all__ = ["FAST_CLASSES", "KernelLinear", "KernelMLP", "KernelPackedLinear", "use_fast_modules"]
