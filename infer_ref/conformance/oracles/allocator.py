"""The block-manager capability: drive any prefix-caching allocator and predict every block id.

An implementation exposes its block manager to the suite through the adapter field
``make_block_manager(num_blocks, block_size, hash_fn) -> allocator``, where ``hash_fn(parent, ids)``
is the chained block hash to use (``parent`` ``None`` for the first block) and ``allocator`` has
the members of :class:`AllocatorUnderTest`. ``BlockManagerDriver`` is infer_ref's own.

:class:`PoolModel` is the specification as a few lists and dicts: the free list (taken from the
head, returned to the tail, a finished request's blocks tail-first), reference counts, which full
written blocks are published under which hash, and which hit is allowed (the longest prefix of
blocks that hold exactly the request's tokens and were computed on top of the block matched before
them, never covering the last prompt token). The state machine in
``infer_ref/conformance/tests/test_block_manager.py`` runs a random workload against an allocator and this
model side by side and requires the same block ids, hits, free order and hash map at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from infer_ref.engine.block_manager import BlockManager, HashFn, TokenSequence


class AllocatorUnderTest(Protocol):
    """What the block-manager capability drives. Requests are named by integer ids.

    Every refused call (pool exhausted) raises and changes nothing.
    """

    num_blocks: int
    block_size: int

    def allocate(self, seq_id: int, token_ids: list[int]) -> tuple[list[int], int]:
        """Admit a request: its block table and how many prompt tokens a prefix hit covers."""
        ...

    def append_token(self, seq_id: int, token_id: int) -> list[int]:
        """Append one token to the request (a new block when the last is full); the table after."""
        ...

    def commit(self, seq_id: int, num_computed_tokens: int) -> None:
        """K/V of positions ``[0, num_computed_tokens)`` are written: publish the blocks that became full."""
        ...

    def free(self, seq_id: int) -> None:
        """Finish or preempt the request: drop its references."""
        ...

    def reset(self) -> None:
        """Forget all cached hashes; refused (raises) while any block is in use."""
        ...

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out."""
        ...

    def ref_count(self, block_id: int) -> int: ...

    def cached_blocks(self) -> dict[int, int]:
        """The hash -> block map used for lookups."""
        ...


class BlockManagerDriver:
    """infer_ref's :class:`~infer_ref.engine.block_manager.BlockManager` behind :class:`AllocatorUnderTest`."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager = manager
        self.num_blocks = manager.num_blocks
        self.block_size = manager.block_size
        self.seqs: dict[int, TokenSequence] = {}

    def allocate(self, seq_id: int, token_ids: list[int]) -> tuple[list[int], int]:
        if seq_id in self.seqs:
            raise ValueError(f"request {seq_id} is already allocated")
        seq = TokenSequence(list(token_ids))
        self.manager.allocate(seq)
        self.seqs[seq_id] = seq
        return list(seq.block_table), seq.num_cached_tokens

    def append_token(self, seq_id: int, token_id: int) -> list[int]:
        seq = self.seqs[seq_id]
        seq.token_ids.append(token_id)
        try:
            self.manager.append(seq)
        except Exception:
            seq.token_ids.pop()
            raise
        return list(seq.block_table)

    def commit(self, seq_id: int, num_computed_tokens: int) -> None:
        self.manager.commit(self.seqs[seq_id], num_computed_tokens)

    def free(self, seq_id: int) -> None:
        self.manager.deallocate(self.seqs.pop(seq_id))

    def reset(self) -> None:
        self.manager.reset()

    def free_block_ids(self) -> list[int]:
        return self.manager.pool.free_block_ids()

    def ref_count(self, block_id: int) -> int:
        return self.manager.pool.ref_count(block_id)

    def cached_blocks(self) -> dict[int, int]:
        return self.manager.cached_blocks()


def driver_factory(manager_cls: type[BlockManager] = BlockManager) -> Callable[[int, int, HashFn], BlockManagerDriver]:
    """An adapter's ``make_block_manager`` over ``manager_cls``."""

    def make(num_blocks: int, block_size: int, hash_fn: HashFn) -> BlockManagerDriver:
        return BlockManagerDriver(manager_cls.with_blocks(num_blocks, block_size, hash_fn=hash_fn))

    return make


@dataclass
class _Record:
    hash: int
    prefix: tuple[int, ...]  # every token from position 0 to the end of this block
    parent: tuple[int, int] | None  # (block, its epoch) this block was computed on top of


@dataclass
class _Seq:
    tokens: list[int]
    table: list[int]
    hashes: list[int] = field(default_factory=list)


class PoolModel:
    """The allocator specification in plain Python (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn) -> None:
        self.bs = block_size
        self.hash_fn = hash_fn
        self.free: list[int] = list(range(num_blocks))
        self.ref = [0] * num_blocks
        self.epoch = [0] * num_blocks
        self.records: dict[int, _Record] = {}
        self.cached: dict[int, int] = {}
        self.seqs: dict[int, _Seq] = {}

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.bs)

    def hits(self, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """Blocks and hashes of the longest verified cached prefix, leaving the last token uncovered."""
        blocks: list[int] = []
        hashes: list[int] = []
        for i in range((len(tokens) - 1) // self.bs):
            h = self.hash_fn(hashes[-1] if hashes else None, tokens[i * self.bs : (i + 1) * self.bs])
            block = self.cached.get(h)
            record = self.records.get(block) if block is not None else None
            parent = (blocks[-1], self.epoch[blocks[-1]]) if blocks else None
            if record is None or record.prefix != tuple(tokens[: (i + 1) * self.bs]) or record.parent != parent:
                break
            blocks.append(block)  # type: ignore[arg-type]
            hashes.append(h)
        return blocks, hashes

    def _take_fresh(self) -> int:
        block = self.free.pop(0)
        self.ref[block] = 1
        record = self.records.pop(block, None)
        if record is not None and self.cached.get(record.hash) == block:
            del self.cached[record.hash]
        self.epoch[block] += 1
        return block

    def allocate(self, seq_id: int, tokens: list[int]) -> tuple[list[int], int] | None:
        """The predicted table and cached-token count, or None when the pool cannot hold the request."""
        hit_blocks, hashes = self.hits(tokens)
        new = self._blocks_for(len(tokens)) - len(hit_blocks)
        if new + sum(1 for b in hit_blocks if b in self.free) > len(self.free):
            return None
        for block in hit_blocks:
            if block in self.free:
                self.free.remove(block)
            self.ref[block] += 1
        table = hit_blocks + [self._take_fresh() for _ in range(new)]
        self.seqs[seq_id] = _Seq(list(tokens), table, list(hashes))
        return list(table), len(hit_blocks) * self.bs

    def append_token(self, seq_id: int, token: int) -> list[int] | None:
        seq = self.seqs[seq_id]
        if self._blocks_for(len(seq.tokens) + 1) > len(seq.table):
            if not self.free:
                return None
            seq.table.append(self._take_fresh())
        seq.tokens.append(token)
        return list(seq.table)

    def commit(self, seq_id: int, num_computed: int) -> None:
        seq = self.seqs[seq_id]
        for i in range(len(seq.hashes), num_computed // self.bs):
            h = self.hash_fn(seq.hashes[-1] if seq.hashes else None, seq.tokens[i * self.bs : (i + 1) * self.bs])
            parent = (seq.table[i - 1], self.epoch[seq.table[i - 1]]) if i else None
            self.records[seq.table[i]] = _Record(h, tuple(seq.tokens[: (i + 1) * self.bs]), parent)
            self.cached[h] = seq.table[i]
            seq.hashes.append(h)

    def free_seq(self, seq_id: int) -> None:
        for block in reversed(self.seqs.pop(seq_id).table):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free.append(block)

    def num_used(self) -> int:
        return len(self.ref) - len(self.free)

    def reset(self) -> bool:
        """False (nothing changes) while blocks are in use."""
        if self.num_used():
            return False
        self.records.clear()
        self.cached.clear()
        return True

    def table(self, seq_id: int) -> list[int]:
        return list(self.seqs[seq_id].table)


def snapshot(allocator: Any) -> tuple[list[int], list[int], dict[int, int]]:
    """What a refused call must leave unchanged: free order, every ref count, the hash map."""
    return (
        list(allocator.free_block_ids()),
        [allocator.ref_count(b) for b in range(allocator.num_blocks)],
        dict(allocator.cached_blocks()),
    )


def collide_all(parent: int | None, token_ids: Sequence[int]) -> int:
    """Every block hashes to 0: only token verification keeps hits correct."""
    return 0


__all__ = ["AllocatorUnderTest", "BlockManagerDriver", "PoolModel", "collide_all", "driver_factory", "snapshot"]
