"""One decode step's head transform, cache write and attention, as one operation per layer.

A static-shape cache (the device-position caches of ``infer_ref/cache/static.py`` and
``static_paged.py``; :class:`~infer_ref.fast.attention.FastAttention` takes this path when the
step is a one-token step on such a layout) decodes one token per row at the device position ``pos``: apply the layer's
head transform to the token's q and k (per-head norms, then RoPE; :class:`~infer_ref.attention.HeadTransform`,
or none when the caller already applied it), write its K/V at ``pos``, then attend over positions
``[0, pos]`` (a sliding layer: its window). On CUDA all of it is one kernel,
:func:`infer_ref.fast.kernels.attention.decode_attention_triton`, reading the length ``pos + 1``
on the device and only the valid prefix.

Why one operation: under ``torch.compile`` a Triton launch that writes into the cache is traced
into the graph, and the compiler may re-lay out or copy what it hands the kernel; a traced
``index_copy_`` into the buffer is functionalized into a copy of the whole layer per step. As a
custom op that declares the cache tensors it mutates (the whole ``[L, ...]`` buffers, graph inputs,
never views of them), the write and the read stay one opaque node that runs in place, in program
order, inside the captured graph.

:func:`contiguous_decode_step` and :func:`paged_decode_step` are the entry points: on CUDA with
Triton they call the custom ops; elsewhere the composition of the torch definitions runs (the
model's own transform, ``store_kvcache_reference``, ``paged_decode_attention_reference``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.attention import HeadTransform
from infer_ref.fast.kernels.attention import (
    HAVE_TRITON,
    contiguous_layer_as_paged,
    decode_attention_triton,
    paged_decode_attention_reference,
    slots_through_tables,
)
from infer_ref.fast.kernels.store import store_kvcache_reference
from infer_ref.norm import NormSpec

# A contiguous layer [B, Hkv, S, D] is read as a paged pool of blocks this long (identity tables).
IDENTITY_BLOCK = 64
# The kernel reads each split's first tile of cached K/V before its dependency wait (the
# ``preload`` of decode_attention_triton). Its promise holds here: inside a model's forward the
# kernel launched just before a layer's step is that layer's q/k/v projection (or something after
# it), never a write of the layer's cached K/V, which only this step itself writes.
PRELOAD = True


def contiguous_decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_all: Tensor,
    v_all: Tensor,
    layer: int,
    lengths: Tensor,
    scale: float,
    window: int | None,
    transform: HeadTransform | None = None,
) -> Tensor:
    """One token per row of a contiguous cache ``k_all``/``v_all`` ``[L, B, Hkv, S, D]``: apply
    ``transform`` to q ``[B, H, D]`` and k ``[B, Hkv, D]`` (if given), write k/v into layer
    ``layer`` at position ``lengths[b] - 1`` of row ``b`` (in place), attend q over the first
    ``lengths[b]`` positions of the row: ``[B, H, D]``. ``lengths`` is computed by the caller
    once per step from the device position (never read on the host)."""
    if HAVE_TRITON and q.is_cuda:
        return torch.ops.infer_ref.contiguous_decode_step(
            q, k, v, *_transform_args(transform, q), k_all, v_all, layer, lengths, float(scale), window or 0
        )
    return _reference_step(q, k, v, transform, *_contiguous_pools(k_all, v_all, layer), lengths, scale, window)


def paged_decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_pools: Tensor,
    v_pools: Tensor,
    layer: int,
    block_tables: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
    transform: HeadTransform | None = None,
) -> Tensor:
    """As :func:`contiguous_decode_step` for a paged cache: ``k_pools``/``v_pools``
    ``[L, num_blocks, block_size, Hkv, D]`` read and written through ``block_tables`` ``[B, M]``."""
    if HAVE_TRITON and q.is_cuda:
        return torch.ops.infer_ref.paged_decode_step(
            q, k, v, *_transform_args(transform, q), k_pools, v_pools, layer, block_tables, lengths, float(scale), window or 0
        )
    return _reference_step(q, k, v, transform, k_pools[layer], v_pools[layer], block_tables, lengths, scale, window)


# -- the definition ---------------------------------------------------------------------------------


def _reference_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    transform: HeadTransform | None,
    k_pool: Tensor,
    v_pool: Tensor,
    block_tables: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
) -> Tensor:
    """The composition the kernel must equal, over one layer's pool ``[num_blocks, bs, Hkv, D]``
    (a contiguous layer as its strided paged view): the model's own transform (its norm modules,
    ``apply_rope``), the store, then attention over the prefix."""
    if transform is not None:
        q4, k4 = transform.apply(q[:, :, None], k[:, :, None])  # [B, H, 1, D], [B, Hkv, 1, D]
        q, k = q4[:, :, 0], k4[:, :, 0]
    block_size = k_pool.shape[1]
    slots = slots_through_tables(block_tables, (lengths - 1)[:, None], block_size).reshape(-1)  # [B]
    store_kvcache_reference(k, v, k_pool, v_pool, slots)
    return paged_decode_attention_reference(q, k_pool, v_pool, block_tables, lengths, scale, window)


def _contiguous_pools(k_all: Tensor, v_all: Tensor, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``layer`` of ``[L, B, Hkv, S, D]`` buffers as paged views and their identity tables."""
    s = k_all.shape[3]
    block = IDENTITY_BLOCK if s % IDENTITY_BLOCK == 0 else s
    k_pool, tables = contiguous_layer_as_paged(k_all[layer], block)
    v_pool, _ = contiguous_layer_as_paged(v_all[layer], block)
    return k_pool, v_pool, tables


# -- custom ops ---------------------------------------------------------------------------------------
# A custom op takes tensors and scalars only: the transform travels as its cos/sin rows ([1 or B, D];
# None: no transform) and the two norms' weights (None: no norms), epsilon and formula.

# Inductor may hand the ops their inputs in any layout (the kernel takes every input's strides).
# Under the default (the eager strides exactly), an input still being computed, such as a step's
# cos/sin rows or its lengths, is copied into a fresh buffer for each op that reads it: 26 copies
# of the RoPE rows for Gemma's 26 layers, in nine small kernels a step. Flexible, it is computed
# once and every layer's op reads that buffer.
STEP_OP_TAGS = (torch.Tag.flexible_layout,)
# The ops' parameters are written a row a role: the token, its transform, the cache, the step.

TransformArgs = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None, float, bool]


def _transform_args(transform: HeadTransform | None, q: Tensor) -> TransformArgs:
    if transform is None:
        return None, None, None, None, 1e-6, False
    d = q.shape[-1]
    cos, sin = transform.cos.reshape(-1, d), transform.sin.reshape(-1, d)  # [T=1, D] or [B, 1, D] -> [1 or B, D]
    if transform.q_norm is None or transform.k_norm is None:
        return cos, sin, None, None, 1e-6, False
    qn: NormSpec = transform.q_norm.spec  # type: ignore[attr-defined]
    kn: NormSpec = transform.k_norm.spec  # type: ignore[attr-defined]
    if (qn.eps, qn.unit_offset) != (kn.eps, kn.unit_offset):
        raise ValueError(f"q_norm and k_norm must share eps and formula, got {qn} and {kn}")
    return cos, sin, qn.weight, kn.weight, float(qn.eps), qn.unit_offset


def _norms(
    q_norm_weight: Tensor | None, k_norm_weight: Tensor | None, eps: float, unit_offset: bool
) -> tuple[NormSpec | None, NormSpec | None]:
    if q_norm_weight is None or k_norm_weight is None:
        return None, None
    return NormSpec(q_norm_weight, eps, unit_offset), NormSpec(k_norm_weight, eps, unit_offset)


@torch.library.custom_op("infer_ref::contiguous_decode_step", mutates_args=("k_all", "v_all"), tags=STEP_OP_TAGS)
def _contiguous_step_op(
    q: Tensor, k: Tensor, v: Tensor, cos: Tensor | None, sin: Tensor | None,
    q_norm_weight: Tensor | None, k_norm_weight: Tensor | None, norm_eps: float, norm_unit_offset: bool,
    k_all: Tensor, v_all: Tensor, layer: int, lengths: Tensor, scale: float, window: int,
) -> Tensor:  # fmt: skip
    k_pool, v_pool, tables = _contiguous_pools(k_all, v_all, layer)
    q_norm, k_norm = _norms(q_norm_weight, k_norm_weight, norm_eps, norm_unit_offset)
    return decode_attention_triton(
        q, k, v, cos, sin, k_pool, v_pool, tables, lengths, scale, window or None, q_norm=q_norm, k_norm=k_norm,
        preload=PRELOAD,
    )  # fmt: skip


@_contiguous_step_op.register_fake
def _contiguous_step_fake(q: Tensor, *args: object) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("infer_ref::paged_decode_step", mutates_args=("k_pools", "v_pools"), tags=STEP_OP_TAGS)
def _paged_step_op(
    q: Tensor, k: Tensor, v: Tensor, cos: Tensor | None, sin: Tensor | None,
    q_norm_weight: Tensor | None, k_norm_weight: Tensor | None, norm_eps: float, norm_unit_offset: bool,
    k_pools: Tensor, v_pools: Tensor, layer: int, block_tables: Tensor, lengths: Tensor, scale: float, window: int,
) -> Tensor:  # fmt: skip
    q_norm, k_norm = _norms(q_norm_weight, k_norm_weight, norm_eps, norm_unit_offset)
    return decode_attention_triton(
        q, k, v, cos, sin, k_pools[layer], v_pools[layer], block_tables, lengths, scale, window or None,
        q_norm=q_norm, k_norm=k_norm, preload=PRELOAD,
    )  # fmt: skip


@_paged_step_op.register_fake
def _paged_step_fake(q: Tensor, *args: object) -> Tensor:
    return torch.empty_like(q)


__all__ = ["contiguous_decode_step", "paged_decode_step"]
