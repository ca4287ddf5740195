"""A paged KV cache with static shapes: the paged layout for captured decode steps.

Storage is a :class:`~infer_ref.cache.pool.BlockPool` (``[L, num_blocks, block_size, Hkv, D]``),
read and written through a block table, as :class:`~infer_ref.cache.paged.PagedKVCache` does; what
differs is when blocks are taken and where the length lives. Every block a row can ever use
(``ceil(max_seq_len / block_size)``) is taken from the pool at construction and the block table is
a device tensor ``[B, M]``; the write position is the device tensor ``pos`` (the position kind
shared with :class:`~infer_ref.cache.static.StaticKVCache`, a
:class:`~infer_ref.cache.position.DevicePosition`).
A decode step then launches the same kernels with the same arguments at every position, so it can
be captured in a CUDA graph; its step carries the block table and the lengths on the device, so
the fast path's fused decode step reads the pool through the table without a gather.

Slots of position ``p`` in row ``b``: ``table[b, p // bs] * bs + p % bs``. With a scrambled pool
(``free_order``) consecutive positions live in scattered blocks: results must not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.device_positioned import DevicePositioned
from infer_ref.cache.pool import BlockPool
from infer_ref.cache.position import DevicePosition
from infer_ref.cache.slots import StoreFn, gather_slots, slots_through_tables, store_rows
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.windows import check_layer_windows, model_layer_windows

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class StaticPagedKVCache(DevicePositioned):
    """Blocks of a pool taken up front for ``max_seq_len`` positions per row; the position on the device.

    Args:
        pool: the block pool; ``batch_size * ceil(max_seq_len / block_size)`` blocks are taken from
            the head of its free list (refused, pool unchanged, when fewer are free).
        max_seq_len: positions each row holds.
        batch_size: rows.
        layer_windows: each layer's sliding window (None: global), kept in snapshots.

    Attributes:
        block_table: ``[B, M]`` int32 block ids on the pool's device (row ``b``, logical block ``c``).
        block_size: positions per block (the pool's).
        pos: int64 ``[1]`` on the device, the position of the next write (``position.pos``).
    """

    position: DevicePosition

    def __init__(
        self,
        pool: BlockPool,
        max_seq_len: int,
        *,
        batch_size: int = 1,
        layer_windows: Sequence[int | None] | None = None,
    ) -> None:
        for name, value in (("max_seq_len", max_seq_len), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        windows = check_layer_windows(layer_windows, pool.num_layers)
        per_row = -(-max_seq_len // pool.block_size)
        ids = pool.acquire(batch_size * per_row)  # raises PoolExhaustedError, pool unchanged
        self.pool = pool
        self.block_size = pool.block_size
        self.geometry = pool.cache_geometry(batch_size)
        self.layer_windows = windows
        self._block_ids = ids
        self.block_table = torch.tensor(ids, dtype=torch.int32, device=pool.device).view(batch_size, per_row)
        self.position = DevicePosition(
            max_seq_len, per_row * pool.block_size, batch_size, pool.device, block_tables=self.block_table
        )
        self.pos = self.position.pos  # the same tensor, never rebound
        # Pool slots of every logical position of every row, [B, S]: what update gathers (built once).
        self._all_slots = slots_through_tables(self.block_table, self.position.slots.expand(batch_size, -1), pool.block_size)

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        max_seq_len: int,
        *,
        block_size: int = 16,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
        free_order: Sequence[int] | None = None,
    ) -> Self:
        """A pool of exactly the blocks the rows need, sized for ``config``, with the model's windows."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len <= 0:
            raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
        num_blocks = batch_size * -(-max_seq_len // block_size)
        pool = BlockPool.from_model_config(config, num_blocks, block_size, dtype=dtype, device=device, free_order=free_order)
        return cls(pool, max_seq_len, batch_size=batch_size, layer_windows=model_layer_windows(config))

    @classmethod
    def from_snapshot(cls, snapshot: KVSnapshot) -> Self:
        """A new cache (and pool) with the snapshot's contents and the source's capacity."""
        settings = snapshot.settings
        capacity = max(int(settings.get("max_seq_len", snapshot.seq_len)), 1)
        block_size = int(settings.get("block_size", 16))
        num_blocks = snapshot.batch_size * -(-capacity // block_size)
        pool = BlockPool.allocate(
            snapshot.num_layers, snapshot.num_kv_heads, snapshot.head_dim, num_blocks, block_size,
            dtype=snapshot.dtype, device=snapshot.device,
        )  # fmt: skip
        cache = cls(pool, capacity, batch_size=snapshot.batch_size, layer_windows=settings.get("layer_windows"))
        cache.restore(snapshot)
        return cache

    # -- geometry ------------------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Bytes of the blocks this cache holds (every layer, K and V)."""
        return len(self._block_ids) * self.pool.bytes_per_block

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor, *, store: StoreFn = store_rows) -> tuple[Tensor, Tensor]:
        """Store ``k``/``v`` ``[B, Hkv, T, D]`` at positions ``pos .. pos+T-1`` of every row (through
        ``store``, see :meth:`StaticKVCache.update`); return the layer's K/V over every slot the rows
        hold, ``[B, Hkv, S, D]`` (hidden past ``pos+T`` by :meth:`attention_mask`)."""
        self.check_write(layer_idx, k, v)
        b, hkv, t, d = k.shape
        slots = slots_through_tables(self.block_table, self.positions(t).expand(b, -1), self.block_size)  # [B, T]
        k_pool, v_pool = self.pool.layer(layer_idx)
        store(
            k.transpose(1, 2).reshape(b * t, hkv, d), v.transpose(1, 2).reshape(b * t, hkv, d), k_pool, v_pool, slots.reshape(-1)
        )
        return gather_slots(k_pool, self._all_slots), gather_slots(v_pool, self._all_slots)

    def get_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s K and V for positions ``[0, seq_len)``, gathered: ``[B, Hkv, seq_len, D]``."""
        self._check_layer(layer_idx)
        k_pool, v_pool = self.pool.layer(layer_idx)
        slots = self._all_slots[:, : self.seq_len]
        return gather_slots(k_pool, slots), gather_slots(v_pool, slots)

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (blocks stay with the cache: its shapes never change)."""
        self._check_crop(n)
        self.position.set(n)

    def reset(self) -> None:
        """Zero this cache's blocks and restart at position 0 (tensor addresses are kept)."""
        ids = torch.tensor(self._block_ids, device=self.device)
        self.pool.k[:, ids] = 0
        self.pool.v[:, ids] = 0
        self.position.set(0)

    def release(self) -> None:
        """Give every block back to the pool (the cache can no longer be used)."""
        self.pool.release(reversed(self._block_ids))
        self._block_ids = []

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(layers={self.num_layers}, batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, block_size={self.block_size}, seq_len={self.seq_len}/{self.max_seq_len}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    # -- snapshot hooks --------------------------------------------------------------------------

    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        """Write positions ``[0, n)`` of ``keys``/``values`` ``[L, B, Hkv, n, D]`` through the table, in place."""
        n = keys.shape[3]
        b, hkv, d = self.batch_size, self.num_kv_heads, self.head_dim
        slots = self._all_slots[:, :n].reshape(-1)  # [B*n]
        for layer in range(self.num_layers):
            k_pool, v_pool = self.pool.layer(layer)
            store_rows(
                keys[layer].transpose(1, 2).reshape(b * n, hkv, d), values[layer].transpose(1, 2).reshape(b * n, hkv, d),
                k_pool, v_pool, slots,
            )  # fmt: skip
        self.position.set(n)

    def _snapshot_settings(self) -> dict[str, Any]:
        return {"max_seq_len": self.max_seq_len, "block_size": self.block_size, "layer_windows": self.layer_windows}
