"""The dispatching entry points of decode attention and their custom ops, one per operation:
``infer_ref::decode_attention`` (one decode step of one layer from the projected q/k/v: it writes
the new token's K/V into the cache) and ``infer_ref::paged_decode_attention`` (attention over a
stored prefix). ``torch.compile`` sees each call as one opaque node (the first declaring the cache
buffers it mutates); CUDA graphs capture the launches. On CUDA with Triton (bf16/fp16/fp32) the
kernel runs; elsewhere the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.attention.checks import AttentionCall
from infer_ref.fast.kernels.attention.launch import decode_attention_triton, paged_decode_attention_triton
from infer_ref.fast.kernels.attention.reference import (
    decode_attention_reference,
    paged_decode_attention_reference,
)
from infer_ref.fast.kernels.common import HAVE_TRITON, KERNEL_DTYPES
from infer_ref.norm import NormSpec


@takes_arguments_of(AttentionCall)
def decode_attention(call: AttentionCall) -> Tensor:
    """:func:`decode_attention_reference`'s contract (the dispatching entry point): ``[B, H, D]``.

    On CUDA with Triton (bf16/fp16/fp32): the fused kernel, called through the custom op
    ``infer_ref::decode_attention``, which declares that it mutates ``k_cache`` and ``v_cache``, so
    ``torch.compile`` keeps it as one opaque node writing the cache in place. Elsewhere: the
    reference.
    """
    call.check()
    c, q = call, call.q
    if HAVE_TRITON and q.is_cuda and q.dtype in KERNEL_DTYPES:
        return torch.ops.infer_ref.decode_attention(
            q, c.k, c.v, c.cos, c.sin, *_norm_args(c.q_norm), *_norm_args(c.k_norm),
            c.k_cache, c.v_cache, c.block_tables, c.seq_lens, float(c.scale), 0 if c.window is None else c.window,
        )  # fmt: skip
    return decode_attention_reference(**call.arguments())


@takes_arguments_of(AttentionCall.paged)
def paged_decode_attention(call: AttentionCall) -> Tensor:
    """:func:`paged_decode_attention_reference`'s contract (the dispatching entry point).

    On CUDA with Triton (bf16/fp16/fp32): the split-K kernel (capturable; lengths stay on the
    device), called through the custom op ``infer_ref::paged_decode_attention`` so ``torch.compile``
    keeps it as one opaque node instead of tracing the launch. Elsewhere: the reference.
    """
    call.check_paged()
    c, q = call, call.q
    if HAVE_TRITON and q.is_cuda and q.dtype in KERNEL_DTYPES:
        return torch.ops.infer_ref.paged_decode_attention(
            q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, float(c.scale), 0 if c.window is None else c.window
        )
    return paged_decode_attention_reference(q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale, c.window)


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


@torch.library.custom_op("infer_ref::paged_decode_attention", mutates_args=())
def _paged_decode_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, window: int
) -> Tensor:
    return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, window or None)


@_paged_decode_op.register_fake
def _paged_decode_fake(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, window: int
) -> Tensor:
    return q.new_empty(q.shape)  # contiguous, as the kernel's output


__all__ = ["decode_attention", "paged_decode_attention"]
