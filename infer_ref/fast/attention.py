"""The fast path's attention: the reference :class:`~infer_ref.models.common.Attention` plus the
decode kernels, chosen from what the step says (never from the cache's type alone, never by
recognising a mask).

- **A one-token step on a static layout** (:class:`StaticKVCache`, :class:`StaticPagedKVCache`;
  the step is ``static_shape`` and carries the lengths ``pos + 1`` on the device): the layer's head
  transform, K/V write and attention over the valid prefix (a sliding layer: its window, from the
  step) in one decode step (``decode_step.py``: one fused Triton kernel on CUDA, the composition of
  the torch definitions elsewhere). No mask: the kernel reads the length on the device, so a step
  at position 100 of a 16k-slot cache reads 100 keys.
- **A one-token step on a paged cache on CUDA** (:class:`PagedKVCache`, the engine's batches): the
  Triton store, then the paged decode kernel reading K/V through the step's block tables with its
  lengths, instead of gathering them.
- **Anything else on an infer_ref slot cache**: the reference attention, its write through the
  Triton store (:func:`~infer_ref.fast.kernels.store.store_kvcache`, the reference off CUDA): it writes in
  place also inside ``torch.compile``, where a traced ``index_copy_`` into the buffer becomes a copy
  of the whole layer per step.
- Any other cache, or none: the reference attention unchanged.
"""

from __future__ import annotations

from torch import Tensor

from infer_ref.attention import HeadTransform, grouped_query_attention
from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.fast.decode_step import contiguous_decode_step, paged_decode_step
from infer_ref.fast.kernels.attention import paged_decode_attention
from infer_ref.fast.kernels.store import store_kvcache
from infer_ref.models.common import Attention
from infer_ref.step import Step

SLOT_CACHES = (StaticKVCache, StaticPagedKVCache, PagedKVCache)


class FastAttention(Attention):
    """:class:`Attention` with the decode kernels (module docstring); the reference code otherwise."""

    def attend(  # the signature of Attention.attend, which this overrides
        self, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform, step: Step, kv_cache: KVCacheProtocol | None,
        layer_idx: int,
    ) -> Tensor:  # fmt: skip
        if step.t == 1 and step.static_shape and isinstance(kv_cache, (StaticKVCache, StaticPagedKVCache)):
            return self._fused_decode_step(q, k, v, transform, step, kv_cache, layer_idx)
        if not isinstance(kv_cache, SLOT_CACHES):
            return super().attend(q, k, v, transform, step, kv_cache, layer_idx)
        q, k = transform.apply(q, k)
        if step.t == 1 and q.is_cuda and isinstance(kv_cache, PagedKVCache):
            return self._paged_decode(q, k, v, step, kv_cache, layer_idx)
        keys, values = kv_cache.update(layer_idx, k, v, store=store_kvcache)  # [B, Hkv, S, D]
        return grouped_query_attention(q, keys, values, step.mask(layer_idx), self.scale)

    def _fused_decode_step(
        self, q: Tensor, k: Tensor, v: Tensor, transform: HeadTransform, step: Step,
        cache: StaticKVCache | StaticPagedKVCache, layer_idx: int,
    ) -> Tensor:  # fmt: skip
        """q ``[B, H, 1, D]``, k/v ``[B, Hkv, 1, D]`` before the transform -> ``[B, H, 1, D]``."""
        cache.check_write(layer_idx, k, v)  # refused before anything is written
        assert step.lengths is not None  # a static layout's step always carries them
        q1, k1, v1 = q[:, :, 0], k[:, :, 0], v[:, :, 0]  # [B, H, D], [B, Hkv, D] x 2
        window = step.window(layer_idx)
        if isinstance(cache, StaticKVCache):
            out = contiguous_decode_step(
                q1, k1, v1, cache.k, cache.v, layer_idx, step.lengths, self.scale, window, transform
            )  # fmt: skip
        else:
            assert step.block_tables is not None  # a paged layout's step carries its table
            out = paged_decode_step(
                q1, k1, v1, cache.pool.k, cache.pool.v, layer_idx, step.block_tables, step.lengths, self.scale, window, transform
            )  # fmt: skip
        return out[:, :, None]  # [B, H, 1, D]

    def _paged_decode(self, q: Tensor, k: Tensor, v: Tensor, step: Step, cache: PagedKVCache, layer_idx: int) -> Tensor:
        """q ``[B, H, 1, D]``, k/v ``[B, Hkv, 1, D]`` (transformed) -> ``[B, H, 1, D]`` through the block tables."""
        cache.write(layer_idx, k, v, store=store_kvcache)
        assert step.lengths is not None and step.block_tables is not None  # a paged step carries both
        k_pool, v_pool = cache.pool.layer(layer_idx)
        out = paged_decode_attention(
            q[:, :, 0], k_pool, v_pool, step.block_tables, step.lengths, self.scale, step.window(layer_idx)
        )  # [B, H, D]
        return out[:, :, None]  # [B, H, 1, D]


__all__ = ["SLOT_CACHES", "FastAttention"]
