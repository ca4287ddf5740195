"""Paged KV cache: positions live in fixed-size blocks of a shared pool.

Each batch row has a block table, one list of physical block ids shared by every layer; position
``p`` of row ``b`` lives at slot ``block_table[b][p // bs] * bs + p % bs`` of each layer's pool
``[num_blocks, bs, Hkv, D]``. Blocks come from a :class:`~infer_ref.cache.pool.BlockPool`, so
several caches (requests) can share one pool.

The cache keeps the contiguous cache's contract, so ``model(ids, cache)`` and ``generate`` work
with it unchanged: ``update`` stores the new K/V through the slot mapping and returns the layer's
K/V gathered through the block tables. A forward's step (:meth:`plan_step`) also carries the
tables and the lengths on the device, so a paged decode kernel can read K/V through the tables
without gathering (the fast path does so on CUDA: :meth:`write` stores without the gather).

Two ways to hold blocks:

- **owning** (``PagedKVCache(pool, ...)``, ``from_model_config``): the cache takes blocks from the
  pool as positions are written and gives them back on ``reset``/``crop``/``release``.
- **a view** (:meth:`over_blocks`): the caller (a block manager, an engine) owns the blocks and the
  tables; the cache writes into them and never takes or frees blocks. Rows may then hold different
  lengths: positions are per row (``[B, T]``) and masks ``[B, T, S]`` over the longest row.

Sliding layers keep every block; the mask (or a kernel's window) enforces the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.base import CacheBase
from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.cache.pool import BlockPool
from infer_ref.cache.position import LayerWrites, RowPositions, check_count
from infer_ref.cache.slots import StoreFn, gather_slots, slots_through_tables, store_rows
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.windows import check_layer_windows, model_layer_windows
from infer_ref.masks import attention_mask, visible_keys
from infer_ref.step import Step

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


@dataclass(frozen=True)
class _StepPlan:
    """Where one forward of ``t`` tokens writes and reads (computed once, used by every layer)."""

    lengths: tuple[int, ...]  # per row, before the write
    t: int
    write_slots: Tensor  # [B*T] int64, row-major (row b's tokens at b*T .. b*T+T-1)
    read_slots: Tensor  # [B, S] int64, S = max(lengths) + t; padding past a row's end reads slot 0
    table: Tensor  # [B, max_blocks] int32 (kernel view of the block tables; -1 past a row's blocks)
    lengths_after: Tensor  # [B] int32, lengths + t (the decode kernel's context lengths)


class PagedKVCache(CacheBase):
    """KV cache over blocks of a :class:`BlockPool` (see the module docstring).

    Args:
        pool: where the blocks come from (and live).
        batch_size: rows; each has its own block table.
        max_seq_len: positions one row may hold (default: all of the pool's blocks, split among rows).
        layer_windows: sliding window of each layer (None: global), as the model uses it; kept in
            snapshots (a forward's step takes the windows from the model).

    Attributes:
        position: each row's length and the capacity (a :class:`~infer_ref.cache.position.RowPositions`).
        block_size: positions per block (the pool's).
    """

    position: RowPositions

    def __init__(
        self,
        pool: BlockPool,
        *,
        batch_size: int = 1,
        max_seq_len: int | None = None,
        layer_windows: Sequence[int | None] | None = None,
    ) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        check_count("batch_size", batch_size)
        default_capacity = (pool.num_blocks // batch_size) * pool.block_size
        if max_seq_len is not None:
            check_count("max_seq_len", max_seq_len)
        self.pool = pool
        self.block_size = pool.block_size
        self.geometry = pool.cache_geometry(batch_size)
        self._batch_size = batch_size
        self.position = RowPositions(default_capacity if max_seq_len is None else max_seq_len, batch_size)
        # What each layer wrote past the rows' lengths (set by write): advance never commits
        # positions a layer did not write, which would read back as a block's stale contents.
        self._writes = LayerWrites(pool.num_layers)
        self._tables: list[list[int]] = [[] for _ in range(batch_size)]
        self._owns_blocks = True
        self.layer_windows = check_layer_windows(layer_windows, pool.num_layers)
        self._plan: _StepPlan | None = None
        self._table_cache: tuple[Any, Tensor] | None = None

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
        max_seq_len: int | None = None,
        free_order: Sequence[int] | None = None,
    ) -> Self:
        """A cache with its own pool of ``num_blocks`` blocks sized for ``config``."""
        pool = BlockPool.from_model_config(
            config, num_blocks, block_size, dtype=dtype, device=device, free_order=free_order
        )
        return cls(pool, batch_size=batch_size, max_seq_len=max_seq_len, layer_windows=model_layer_windows(config))

    @classmethod
    def from_memory_budget(
        cls,
        config: ModelConfig,
        budget_bytes: int,
        block_size: int = 16,
        *,
        batch_size: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> Self:
        """A cache whose pool takes as many blocks as ``budget_bytes`` holds (see ``pool.free_gpu_budget``)."""
        pool = BlockPool.from_memory_budget(config, budget_bytes, block_size, dtype=dtype, device=device)
        return cls(pool, batch_size=batch_size, layer_windows=model_layer_windows(config))

    @classmethod
    def over_blocks(
        cls,
        pool: BlockPool,
        block_tables: Sequence[Sequence[int]],
        lengths: Sequence[int],
        *,
        layer_windows: Sequence[int | None] | None = None,
    ) -> Self:
        """A view over blocks someone else owns: row ``b`` holds ``lengths[b]`` positions in ``block_tables[b]``.

        Writes must fit in the blocks given (extend a table before the forward); ``reset``, ``crop``
        and ``release`` are refused, since the blocks are not this cache's to free.
        """
        if len(block_tables) == 0 or len(block_tables) != len(lengths):
            raise ValueError(f"need one block table per length, got {len(block_tables)} tables and {len(lengths)} lengths")
        cache = cls(pool, batch_size=len(block_tables), layer_windows=layer_windows)
        for row, (table, n) in enumerate(zip(block_tables, lengths, strict=True)):
            ids = [int(b) for b in table]
            for block_id in ids:
                if pool.is_free(block_id):
                    raise ValueError(f"row {row}: block {block_id} is free in the pool; a view needs allocated blocks")
            check_count(f"lengths[{row}]", n, allow_zero=True)
            if n > len(ids) * pool.block_size:
                raise ValueError(f"row {row}: {n} positions need {-(-n // pool.block_size)} blocks, table has {len(ids)}")
            cache._tables[row] = ids
        cache._owns_blocks = False
        cache.position.capacity = max(len(t) for t in cache._tables) * pool.block_size
        cache.position.set_rows(lengths)
        return cache

    @classmethod
    def from_snapshot(cls, snapshot: KVSnapshot) -> Self:
        """A new cache (with a new pool of the source's size) holding the snapshot's positions."""
        settings = snapshot.settings
        block_size = int(settings.get("block_size", 16))
        needed = snapshot.batch_size * -(-snapshot.seq_len // block_size)
        pool = BlockPool.allocate(
            snapshot.num_layers,
            snapshot.num_kv_heads,
            snapshot.head_dim,
            max(int(settings.get("num_blocks", needed)), needed, 1),
            block_size,
            dtype=snapshot.dtype,
            device=snapshot.device,
        )
        windows = settings.get("layer_windows")
        cache = cls(pool, batch_size=snapshot.batch_size, max_seq_len=settings.get("max_seq_len"), layer_windows=windows)
        cache.restore(snapshot)
        return cache

    # -- geometry ------------------------------------------------------------------------------

    @property
    def lengths(self) -> list[int]:
        """Positions held by each row."""
        return list(self.position.lengths)

    @property
    def remaining_capacity(self) -> int:
        """Positions every row can still take: limited by ``max_seq_len`` and, for an owning cache,
        by the blocks it holds plus its share of the pool's free blocks."""
        bs = self.block_size
        per_row_blocks = [len(t) for t in self._tables]
        if self._owns_blocks:
            extra = self.pool.num_free // self._batch_size
            reachable = min((n + extra) * bs for n in per_row_blocks)
            return max(0, min(self.max_seq_len, reachable) - self.seq_len)
        return max(0, min(n * bs - length for n, length in zip(per_row_blocks, self.position.lengths, strict=True)))

    @property
    def block_tables(self) -> list[list[int]]:
        """A copy of each row's block ids."""
        return [list(t) for t in self._tables]

    @property
    def num_blocks_held(self) -> int:
        return sum(len(t) for t in self._tables)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the blocks this cache holds (every layer, K and V); the pool's total is ``pool.memory_bytes``."""
        return self.num_blocks_held * self.pool.bytes_per_block

    @property
    def used_bytes(self) -> int:
        """Bytes the filled positions take (rows summed; a partly filled last block counts its filled rows)."""
        return sum(self.position.lengths) * (self.bytes_per_position // self._batch_size)

    # -- the step ------------------------------------------------------------------------------

    def positions(self, t: int) -> Tensor:
        """``[T]`` when every row holds the same length, else per row ``[B, T]``."""
        start = torch.tensor(self.position.lengths, device=self.device)[:, None]  # [B, 1]
        per_row = start + torch.arange(t, device=self.device)  # [B, T]
        return per_row[0] if self.position.uniform() else per_row

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        """``[T, S]`` (or None) for equal rows; ``[B, T, S]`` over the longest row otherwise."""
        if self.position.uniform():
            return attention_mask(t, self.position.lengths[0], window, self.device)
        return visible_keys(self.positions(t), self.seq_len + t, window)  # [B, T, S]

    def plan_step(self, t: int, windows: Sequence[int | None]) -> Step:
        """The forward's step: per-row positions and masks, the tables and lengths after the write.

        Blocks for the ``t`` new positions are taken here (refused, nothing changed, when they cannot
        be), so every layer's write finds them.
        """
        plan = self._plan_for(t)
        return Step(
            t,
            self.positions(t),  # [T] or [B, T]
            tuple(windows),
            lambda window: self.attention_mask(t, window),  # [T, S], [B, T, S] or None
            lengths=plan.lengths_after,  # [B] int32
            block_tables=plan.table,  # [B, M] int32
        )

    # -- use -----------------------------------------------------------------------------------

    def update(self, layer_idx: int, k: Tensor, v: Tensor, *, store: StoreFn = store_rows) -> tuple[Tensor, Tensor]:
        """Store ``k``/``v`` ``[B, Hkv, T, D]`` at each row's next ``T`` positions (:meth:`write`); return
        the layer's K/V ``[B, Hkv, S, D]`` gathered through the tables (``S`` = longest row after the
        write; shorter rows are padded and hidden by :meth:`attention_mask`)."""
        plan = self.write(layer_idx, k, v, store=store)
        k_pool, v_pool = self.pool.layer(layer_idx)
        return gather_slots(k_pool, plan.read_slots), gather_slots(v_pool, plan.read_slots)

    def advance(self, n: int) -> None:
        """Every row moves forward by ``n`` (once per forward, after every layer wrote those ``n`` positions).

        Refused, with nothing changed (no block taken), past the capacity or when a layer did not
        write them: unwritten slots would read back whatever their block held before.
        """
        check_count("advance(n)", n)
        if self._owns_blocks:
            self.position.check_room(n)
        short = self._writes.short_of(n)
        if short:
            at = self.seq_len if self.position.uniform() else f"lengths {self.position.lengths}"
            raise ValueError(
                f"advance({n}) from {at} needs every layer to have written each row's next {n} position(s); "
                f"layer(s) {short[:8]} wrote {self._writes.fewest(short)} (update every layer before advancing: "
                "unwritten slots would read back a block's stale contents)"
            )
        self.position.advance(n)  # the writes took the blocks: never refused here
        self._writes.commit(n)
        self._plan = None

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions; blocks past ``ceil(n / bs)`` go back to the pool (last first)."""
        self._require_owner("crop")
        if not self.position.uniform():
            raise ValueError(f"crop needs rows of equal length, rows hold {self.position.lengths}")
        self._check_crop(n)
        keep = -(-n // self.block_size)
        for row, table in enumerate(self._tables):
            self.pool.release(reversed(table[keep:]))
            self._tables[row] = table[:keep]
        self.position.set(n)
        self._writes.clear()
        self._plan = None

    def reset(self) -> None:
        """Give every block back to the pool (each table tail first) and restart at position 0.

        Blocks are not zeroed: a block is only ever read at positions its holder wrote.
        """
        self._require_owner("reset")
        self.release()

    def release(self) -> None:
        """Give every block back to the pool (each table tail first); the cache is then empty."""
        self._require_owner("release")
        for table in self._tables:
            self.pool.release(reversed(table))
        self._tables = [[] for _ in range(self._batch_size)]
        self.position.set(0)
        self._writes.clear()
        self._plan = None

    def get_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s K and V ``[B, Hkv, seq_len, D]``, gathered (rows of equal length)."""
        self._check_layer(layer_idx)
        if not self.position.uniform():
            raise ValueError(f"get_kv needs rows of equal length, rows hold {self.position.lengths}")
        slots = self._slots(self.seq_len)
        k_pool, v_pool = self.pool.layer(layer_idx)
        return gather_slots(k_pool, slots), gather_slots(v_pool, slots)

    def slot_mapping(self, positions: Sequence[int], row: int = 0) -> list[int]:
        """Slots of ``positions`` of one row: ``table[p // bs] * bs + p % bs`` (blocks must be held)."""
        table, bs = self._tables[row], self.block_size
        return [table[p // bs] * bs + p % bs for p in positions]

    def __repr__(self) -> str:
        owner = "owning" if self._owns_blocks else "view"
        return (
            f"PagedKVCache({owner}, batch={self._batch_size}, lengths={self.position.lengths}, blocks={self.num_blocks_held}, "
            f"block_size={self.block_size}, max_seq_len={self.max_seq_len}, pool={self.pool!r})"
        )

    # -- the write path ------------------------------------------------------------------------

    def write(self, layer_idx: int, k: Tensor, v: Tensor, *, store: StoreFn = store_rows) -> _StepPlan:
        """Store ``k``/``v`` ``[B, Hkv, T, D]`` at each row's next ``T`` positions through ``store``
        (default: an indexed copy; the fast path hands the Triton store), without reading anything back."""
        t = self._check_write(layer_idx, k, v)
        plan = self._plan_for(t)  # allocates any missing blocks, or raises with nothing changed
        b, hkv, _, d = k.shape
        k_pool, v_pool = self.pool.layer(layer_idx)
        store(
            k.transpose(1, 2).reshape(b * t, hkv, d),  # [B*T, Hkv, D], row-major like write_slots
            v.transpose(1, 2).reshape(b * t, hkv, d),
            k_pool,
            v_pool,
            plan.write_slots,
        )
        self._writes.record(layer_idx, t)
        return plan

    def _plan_for(self, t: int) -> _StepPlan:
        """The slots of this forward, computed at its first layer and reused by the others.

        Slots come from the block tables on the device (``table[p // bs] * bs + p % bs``), so a step
        costs a few small kernels, not Python work proportional to the context.
        """
        lengths = tuple(self.position.lengths)
        if self._plan is not None and self._plan.lengths == lengths and self._plan.t == t:
            return self._plan
        self._ensure_blocks(t)
        table = self._device_table()  # [B, M] int64, -1 past each row's blocks
        bs, device = self.block_size, self.device
        starts = torch.tensor(lengths, dtype=torch.long, device=device)[:, None]  # [B, 1]
        ends = starts + t  # [B, 1], positions held after the write
        read_pos = torch.arange(max(lengths) + t, device=device).expand(len(lengths), -1)  # [B, S]
        write_pos = starts + torch.arange(t, device=device)  # [B, T]
        read = slots_through_tables(table, read_pos, bs)
        self._plan = _StepPlan(
            lengths=lengths,
            t=t,
            write_slots=slots_through_tables(table, write_pos, bs).reshape(-1),
            read_slots=torch.where(read_pos < ends, read, 0),  # padding past a row's end reads slot 0, masked
            table=table.to(torch.int32),
            lengths_after=ends[:, 0].to(torch.int32),
        )
        return self._plan

    def _device_table(self) -> Tensor:
        """The block tables as one ``[B, M]`` int64 device tensor, rebuilt only when a table changed."""
        key = tuple(tuple(t) for t in self._tables)  # O(blocks) once per forward, not per layer
        if self._table_cache is None or self._table_cache[0] != key:
            width = max(1, *(len(t) for t in self._tables))
            rows = [t + [-1] * (width - len(t)) for t in self._tables]
            self._table_cache = (key, torch.tensor(rows, dtype=torch.long, device=self.device))
        return self._table_cache[1]

    def _ensure_blocks(self, t: int) -> None:
        """Make every row's table cover ``length + t`` positions; refuse, changing nothing, if it cannot."""
        bs = self.block_size
        if self._owns_blocks:
            self.position.check_room(t)
        lengths = self.position.lengths
        missing = [max(0, -(-(n + t) // bs) - len(tbl)) for n, tbl in zip(lengths, self._tables, strict=True)]
        if sum(missing) == 0:
            return
        if not self._owns_blocks:
            row = next(i for i, m in enumerate(missing) if m)
            raise KVCacheOverflowError(
                f"row {row} holds {lengths[row]} positions in {len(self._tables[row])} block(s) of {bs}; "
                f"{t} more need {missing[row]} more block(s), and this view cannot take blocks (extend its table)"
            )
        new = self.pool.acquire(sum(missing))  # PoolExhaustedError (an overflow) before any change
        for row, m in enumerate(missing):
            self._tables[row].extend(new[:m])
            new = new[m:]

    # -- helpers -------------------------------------------------------------------------------

    def _slots(self, length: int) -> Tensor:
        return torch.tensor(
            [self.slot_mapping(range(length), row) for row in range(self._batch_size)], dtype=torch.long, device=self.device
        )  # [B, length]

    def _require_owner(self, what: str) -> None:
        if not self._owns_blocks:
            raise TypeError(f"{what} refused: this cache is a view over blocks its caller owns; free them there")

    def _check_restore_capacity(self, n: int) -> None:
        self._require_owner("restore")
        super()._check_restore_capacity(n)
        needed = self._batch_size * -(-n // self.block_size)
        available = self.num_blocks_held + self.pool.num_free
        if needed > available:
            raise KVCacheOverflowError(
                f"snapshot of {n} positions needs {needed} blocks of {self.block_size}; this cache can get "
                f"{available} (held + free in the pool); nothing restored"
            )

    def _load_positions(self, keys: Tensor, values: Tensor) -> None:
        self.release()
        n = keys.shape[3]
        self._ensure_blocks(n)  # checked to fit by _check_restore_capacity
        slots = self._slots(n).reshape(-1)  # [B*S]
        for layer in range(self.num_layers):
            k_pool, v_pool = self.pool.layer(layer)
            k_rows = keys[layer].transpose(1, 2).reshape(-1, self.num_kv_heads, self.head_dim)  # [B*S, Hkv, D]
            v_rows = values[layer].transpose(1, 2).reshape(-1, self.num_kv_heads, self.head_dim)
            store_rows(k_rows, v_rows, k_pool, v_pool, slots)
        self.position.set(n)
        self._writes.clear()
        self._plan = None

    def _snapshot_settings(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "num_blocks": self.pool.num_blocks,
            "max_seq_len": self.max_seq_len,
            "layer_windows": self.layer_windows,
        }
