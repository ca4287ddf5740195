"""Prefix caching: a block manager that shares full blocks between requests by chained hashes.

The :class:`~infer_ref.cache.pool.BlockPool` owns the blocks, their reference counts and the free
order; the :class:`BlockManager` owns what a prefix cache adds on top: the hash of every full,
written block, the hash -> block map used for lookups, the token ids each published block holds,
each request's block table, and the hit counters.

**Hashes.** A full block of token ids ``t`` at depth ``i`` of a sequence hashes to
``h_i = xxh64(h_(i-1) as 8 bytes little-endian ‖ t as little-endian int64)`` (no parent bytes
for ``h_0``, seed 0). The same tokens at two depths (or after two different prefixes) hash
differently, and the value is the same in every process. Only full blocks are hashed, and a
block's hash is *published* (entered in the map) only by :meth:`BlockManager.commit`, after its
K/V were written.

**Hits are verified.** A hash is a fingerprint, not a proof: on a lookup the candidate block's
token ids must equal the request's, and the candidate must have been computed on top of the block
the previous depth matched (its parent block, in the same *epoch*: a block's epoch advances every
time it is taken for new content). By induction the whole prefix is verified, so even with every
hash equal a hit is never wrong, only rarer.

**Lifecycle of a request** (:class:`TokenSequence`):

1. :meth:`~BlockManager.allocate` looks up the prompt's full blocks, longest verified prefix
   first, but never so many that the last prompt token is covered (one token must be computed to
   get logits); claims the hit blocks, *then* takes new blocks for the rest, so a request never
   evicts its own hit. ``num_cached_tokens`` says how many prompt tokens need no compute.
2. The caller writes K/V for positions ``[num_cached_tokens, len)`` and calls
   :meth:`~BlockManager.commit` with how many positions are now written; blocks that became full
   are hashed and published.
3. Before each decode step the new token is appended to ``token_ids`` and
   :meth:`~BlockManager.append` adds a block when the last one is full.
4. :meth:`~BlockManager.deallocate` (finish or preempt) drops the request's references.

**Free order** (the pool's contract plus one rule here): ``deallocate`` releases a table
tail-first, so a finished request's last block enters the free list first and its first block
last; the pool hands out blocks from the head of the free list. Hence the least recently freed
block is reused first, and within one request the deepest blocks go before the ones its prefix
starts with (a prefix of block 0..i stays usable as long as possible). A free block keeps its
hash and can be revived by a hit (``claim``) until it is taken for new content; taking it drops
its old map entry.

Every refused call raises before changing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash
from typing_extensions import Self

from infer_ref.cache.pool import BlockPool, PoolExhaustedError

HashFn = Callable[[int | None, Sequence[int]], int]


def block_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """``xxh64(parent as 8 bytes little-endian ‖ token_ids as little-endian int64)``, seed 0.

    ``parent`` is the previous block's hash (``None`` for the first block of a sequence).
    """
    if parent is not None and not 0 <= parent < 2**64:
        raise ValueError(f"parent hash must be an unsigned 64-bit integer, got {parent!r}")
    ids = list(token_ids)
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**63 for t in ids):
        raise ValueError(f"token ids must be non-negative integers below 2**63 (int64), got {ids[:16]}")
    h = xxhash.xxh64()
    if parent is not None:
        h.update(parent.to_bytes(8, "little"))
    h.update(np.asarray(ids, dtype="<i8").tobytes())
    return h.intdigest()


def chain_hashes(token_ids: Sequence[int], block_size: int, hash_fn: HashFn = block_hash) -> list[int]:
    """Hashes of every *full* block of ``token_ids`` (a partial last block has none)."""
    out: list[int] = []
    parent: int | None = None
    for i in range(len(token_ids) // block_size):
        parent = hash_fn(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out


@dataclass(eq=False)
class TokenSequence:
    """One request as the block manager sees it.

    Attributes:
        token_ids: prompt and generated tokens so far (the caller appends).
        block_table: physical block of positions ``[i*bs, (i+1)*bs)`` at index ``i``.
        num_cached_tokens: prompt tokens served by a prefix hit at the last ``allocate``.
        num_computed_tokens: positions ``[0, n)`` whose K/V are in the table's blocks.
        block_hashes: hashes of the full blocks published or hit, in order (the chain so far).
    """

    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    block_hashes: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def num_blocks(self, block_size: int) -> int:
        """``ceil(len / block_size)``: the table length the next forward needs."""
        return -(-len(self.token_ids) // block_size)

    def block_tokens(self, i: int, block_size: int) -> tuple[int, ...]:
        return tuple(self.token_ids[i * block_size : (i + 1) * block_size])


@dataclass(frozen=True)
class PublishedBlock:
    """What the manager knows about a full, written block: its hash, its token ids, and the
    block (and that block's epoch) it was computed on top of (``None`` at depth 0)."""

    hash: int
    token_ids: tuple[int, ...]
    parent: tuple[int, int] | None


@dataclass
class PrefixCacheStats:
    """Counters since construction: full prompt blocks looked up and hit, prompt tokens seen and
    served from the cache."""

    block_queries: int = 0
    block_hits: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Fraction of prompt tokens served from the cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class BlockManager:
    """Block tables, chained block hashes and prefix hits over one :class:`BlockPool`."""

    def __init__(self, pool: BlockPool, *, enable_prefix_caching: bool = True, hash_fn: HashFn = block_hash) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.stats = PrefixCacheStats()
        self._cached: dict[int, int] = {}  # hash -> block holding those tokens
        self._published: dict[int, PublishedBlock] = {}  # block -> its record
        self._epoch = [0] * pool.num_blocks  # advances each time a block is taken for new content

    @classmethod
    def with_blocks(
        cls, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True, hash_fn: HashFn = block_hash
    ) -> Self:
        """A manager over a minimal pool (one layer, one head, head_dim 1): the bookkeeping alone."""
        pool = BlockPool.allocate(1, 1, 1, num_blocks, block_size, dtype=torch.float32, device="cpu")
        return cls(pool, enable_prefix_caching=enable_prefix_caching, hash_fn=hash_fn)

    # -- introspection -------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def cached_blocks(self) -> dict[int, int]:
        """A copy of the hash -> block map."""
        return dict(self._cached)

    def published(self, block_id: int) -> PublishedBlock | None:
        return self._published.get(block_id)

    # -- lookup --------------------------------------------------------------------------------

    def _lookup_hits(self, seq: TokenSequence) -> tuple[list[int], list[int], int]:
        """Blocks of the longest verified cached prefix, their hashes, and how many blocks were queried.

        At most ``(len - 1) // bs`` blocks: a hit never covers the last prompt token.
        """
        bs = self.block_size
        queryable = self._max_hit_blocks(len(seq.token_ids))
        hits: list[int] = []
        hashes: list[int] = []
        parent_hash: int | None = None
        for i in range(queryable):
            tokens = seq.block_tokens(i, bs)
            h = self.hash_fn(self._parent_for_hash(parent_hash), tokens)
            block = self._cached.get(h)
            if block is None or not self._verified(block, tokens, hits[-1] if hits else None):
                break
            hits.append(block)
            hashes.append(h)
            parent_hash = h
        return hits, hashes, queryable

    def _max_hit_blocks(self, num_tokens: int) -> int:
        """Full blocks before the last token: at least one token is left to compute for logits."""
        return (num_tokens - 1) // self.block_size

    def _parent_for_hash(self, parent_hash: int | None) -> int | None:
        return parent_hash

    def _verified(self, block: int, tokens: tuple[int, ...], parent_block: int | None) -> bool:
        """The candidate holds ``tokens`` and was computed on top of ``parent_block`` as it is now."""
        record = self._published.get(block)
        if record is None or record.token_ids != tokens:
            return False
        expected_parent = None if parent_block is None else (parent_block, self._epoch[parent_block])
        return record.parent == expected_parent

    # -- allocation ----------------------------------------------------------------------------

    def can_allocate(self, seq: TokenSequence) -> bool:
        """Whether :meth:`allocate` would succeed now."""
        hits = self._lookup_hits(seq)[0] if self.enable_prefix_caching else []
        return self._blocks_to_take(seq, hits) <= self.pool.num_free

    def _blocks_to_take(self, seq: TokenSequence, hits: list[int]) -> int:
        """Free-list entries an allocation consumes: new blocks plus hit blocks that sit free."""
        return seq.num_blocks(self.block_size) - len(hits) + sum(1 for b in hits if self.pool.is_free(b))

    def allocate(self, seq: TokenSequence) -> None:
        """Give ``seq`` a block table for its tokens, reusing the longest verified cached prefix.

        Raises ``PoolExhaustedError`` (nothing changed) when the pool cannot hold it.
        """
        self._check_unallocated(seq)
        hits, hashes, queried = self._lookup_hits(seq) if self.enable_prefix_caching else ([], [], 0)
        needed = self._blocks_to_take(seq, hits)
        if needed > self.pool.num_free:
            raise PoolExhaustedError(
                f"cannot allocate {seq.num_blocks(self.block_size)} block(s) for a {len(seq)}-token request "
                f"({len(hits)} cached): {needed} free block(s) needed, {self.pool.num_free} free of "
                f"{self.num_blocks} (block_size {self.block_size})"
            )
        table = self._take_blocks(hits, seq.num_blocks(self.block_size) - len(hits))
        seq.block_table = table
        seq.block_hashes = hashes
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self.stats.block_queries += queried
        self.stats.block_hits += len(hits)
        self.stats.prompt_tokens += len(seq)
        self.stats.cached_tokens += seq.num_cached_tokens

    def _take_blocks(self, hits: list[int], num_new: int) -> list[int]:
        """Claim (or share) the hit blocks first, then take ``num_new`` fresh ones from the free list."""
        for block in hits:
            if self.pool.is_free(block):
                self.pool.claim(block)
            else:
                self.pool.share(block)
        return hits + self._acquire_fresh(num_new)

    def _acquire_fresh(self, n: int) -> list[int]:
        """Blocks for new content: their old hash entries are dropped and their epoch advances."""
        fresh = self.pool.acquire(n)
        for block in fresh:
            self._forget(block)
        return fresh

    def _forget(self, block: int) -> None:
        record = self._published.pop(block, None)
        if record is not None and self._cached.get(record.hash) == block:
            del self._cached[record.hash]
        self._epoch[block] += 1

    def _check_unallocated(self, seq: TokenSequence) -> None:
        if seq.block_table:
            raise ValueError(f"sequence already holds blocks {seq.block_table}: deallocate it first")
        if not seq.token_ids:
            raise ValueError("cannot allocate an empty sequence: it needs at least one token")

    # -- decode --------------------------------------------------------------------------------

    def can_append(self, seq: TokenSequence) -> bool:
        return seq.num_blocks(self.block_size) == len(seq.block_table) or self.pool.num_free >= 1

    def append(self, seq: TokenSequence) -> None:
        """Make room for the token just appended to ``seq.token_ids`` (a new block when the last is full).

        Raises ``PoolExhaustedError`` (nothing changed) when a block is needed and none is free.
        """
        if not seq.block_table:
            raise ValueError("append on a sequence without blocks: allocate it first")
        missing = seq.num_blocks(self.block_size) - len(seq.block_table)
        if missing not in (0, 1):
            raise ValueError(
                f"sequence of {len(seq)} tokens needs {seq.num_blocks(self.block_size)} blocks but holds "
                f"{len(seq.block_table)}: append after every new token, one at a time"
            )
        if missing == 1:
            seq.block_table.append(self._acquire_fresh(1)[0])

    # -- publishing ----------------------------------------------------------------------------

    def commit(self, seq: TokenSequence, num_computed_tokens: int) -> None:
        """Record that K/V of positions ``[0, num_computed_tokens)`` are written; publish the full blocks."""
        n = num_computed_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not seq.num_computed_tokens <= n <= len(seq):
            raise ValueError(
                f"num_computed_tokens must be an integer in [{seq.num_computed_tokens}, {len(seq)}] "
                f"(already computed .. sequence length), got {n!r}"
            )
        if n > len(seq.block_table) * self.block_size:
            raise ValueError(f"{n} computed tokens do not fit the {len(seq.block_table)} block(s) of the table")
        seq.num_computed_tokens = n
        if self.enable_prefix_caching:
            for i in range(len(seq.block_hashes), n // self.block_size):
                self._publish(seq, i)

    def _publish(self, seq: TokenSequence, i: int) -> None:
        tokens = seq.block_tokens(i, self.block_size)
        parent_hash = seq.block_hashes[i - 1] if i else None
        h = self.hash_fn(self._parent_for_hash(parent_hash), tokens)
        block = seq.block_table[i]
        parent = None if i == 0 else (seq.block_table[i - 1], self._epoch[seq.block_table[i - 1]])
        self._published[block] = PublishedBlock(h, tokens, parent)
        self._cached[h] = block  # the latest writer of a hash serves later lookups
        seq.block_hashes.append(h)

    # -- release -------------------------------------------------------------------------------

    def deallocate(self, seq: TokenSequence) -> None:
        """Drop ``seq``'s references (finish or preempt), last block first; the sequence keeps its tokens."""
        self.pool.release(reversed(seq.block_table))
        seq.block_table = []
        seq.block_hashes = []
        seq.num_cached_tokens = seq.num_computed_tokens = 0

    def reset(self) -> None:
        """Forget every cached hash (the counters stay). Refused while any block is in use."""
        if self.pool.num_used:
            raise RuntimeError(
                f"cannot reset the prefix cache while {self.pool.num_used} block(s) are in use: "
                "deallocate every request first"
            )
        self._cached.clear()
        self._published.clear()

    def __repr__(self) -> str:
        return (
            f"BlockManager(blocks={self.num_blocks}x{self.block_size}, free={self.pool.num_free}, "
            f"cached={len(self._cached)}, prefix_caching={self.enable_prefix_caching})"
        )


__all__ = [
    "BlockManager",
    "HashFn",
    "PoolExhaustedError",
    "PrefixCacheStats",
    "PublishedBlock",
    "TokenSequence",
    "block_hash",
    "chain_hashes",
]
