"""One decode step's cache write and attention, as one operation per layer.

A static-shape cache (the device-position caches of ``infer_ref/cache/static.py`` and
``static_paged.py``) decodes one token per row at the device position ``pos``: write the token's
K/V at ``pos``, then attend over positions ``[0, pos]`` (a sliding layer: its window) with the
length-aware split-K kernel of :mod:`infer_ref.kernels.paged_attention`.

Why one operation: under ``torch.compile`` a Triton launch that writes into the cache is traced
into the graph, and the compiler may re-lay out or copy what it hands the kernel; a traced
``index_copy_`` into the buffer is functionalized into a copy of the whole layer per step. As a
custom op that declares the cache tensors it mutates (the whole ``[L, ...]`` buffers, graph inputs,
never views of them), the write and the read stay one opaque node that runs in place, in program
order, inside the captured graph.

:func:`contiguous_decode_step` and :func:`paged_decode_step` are the entry points: on CUDA with
Triton they call the custom ops; elsewhere the same composition of the torch references runs.
Either way the result is ``store_kvcache`` then ``*_decode_attention`` — the definition.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.kernels.paged_attention import HAVE_TRITON, contiguous_decode_attention, paged_decode_attention
from infer_ref.kernels.store import store_kvcache


def contiguous_decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_all: Tensor,
    v_all: Tensor,
    layer: int,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
) -> Tensor:
    """Write ``k``/``v`` ``[B, Hkv, D]`` into layer ``layer`` of a contiguous cache ``k_all``/``v_all``
    ``[L, B, Hkv, S, D]`` (in place) at ``slots`` ``[B*Hkv]`` of the layer seen as ``[B*Hkv, S]``
    rows (row ``b``, head ``h``, position ``p``: slot ``(b*Hkv + h)*S + p``), then attend ``q``
    ``[B, H, D]`` over the first ``lengths[b]`` positions of each row: ``[B, H, D]``.

    Slots and lengths come from the caller (computed once per step from the device position, not
    once per layer).
    """
    if HAVE_TRITON and q.is_cuda:
        return torch.ops.infer_ref.contiguous_decode_step(
            q, k, v, k_all, v_all, layer, slots, lengths, float(scale), window or 0
        )
    return _contiguous_step(q, k, v, k_all, v_all, layer, slots, lengths, scale, window)


def paged_decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_pools: Tensor,
    v_pools: Tensor,
    layer: int,
    block_tables: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
) -> Tensor:
    """As :func:`contiguous_decode_step` for a paged cache: ``k_pools``/``v_pools``
    ``[L, num_blocks, block_size, Hkv, D]``, ``slots`` ``[B]`` pool slots of the new token,
    attention read through ``block_tables`` ``[B, M]``."""
    if HAVE_TRITON and q.is_cuda:
        return torch.ops.infer_ref.paged_decode_step(
            q, k, v, k_pools, v_pools, layer, block_tables, slots, lengths, float(scale), window or 0
        )
    return _paged_step(q, k, v, k_pools, v_pools, layer, block_tables, slots, lengths, scale, window)


def _contiguous_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_all: Tensor,
    v_all: Tensor,
    layer: int,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
) -> Tensor:
    _, b, hkv, s, d = k_all.shape
    rows = k_all[layer].view(b * hkv, s, 1, d), v_all[layer].view(b * hkv, s, 1, d)  # one store row per (row, head, position)
    store_kvcache(k.reshape(b * hkv, 1, d), v.reshape(b * hkv, 1, d), *rows, slots)
    return contiguous_decode_attention(q, k_all[layer], v_all[layer], lengths, scale, window)


def _paged_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_pools: Tensor,
    v_pools: Tensor,
    layer: int,
    block_tables: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int | None,
) -> Tensor:
    store_kvcache(k, v, k_pools[layer], v_pools[layer], slots)
    return paged_decode_attention(q, k_pools[layer], v_pools[layer], block_tables, lengths, scale, window)


@torch.library.custom_op("infer_ref::contiguous_decode_step", mutates_args=("k_all", "v_all"))
def _contiguous_step_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_all: Tensor,
    v_all: Tensor,
    layer: int,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    return _contiguous_step(q, k, v, k_all, v_all, layer, slots, lengths, scale, window or None)


@_contiguous_step_op.register_fake
def _contiguous_step_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_all: Tensor,
    v_all: Tensor,
    layer: int,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("infer_ref::paged_decode_step", mutates_args=("k_pools", "v_pools"))
def _paged_step_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_pools: Tensor,
    v_pools: Tensor,
    layer: int,
    block_tables: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    return _paged_step(q, k, v, k_pools, v_pools, layer, block_tables, slots, lengths, scale, window or None)


@_paged_step_op.register_fake
def _paged_step_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_pools: Tensor,
    v_pools: Tensor,
    layer: int,
    block_tables: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    return torch.empty_like(q)


__all__ = ["contiguous_decode_step", "paged_decode_step"]
