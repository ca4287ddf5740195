"""Planted prefix-cache bugs: ``BlockManager`` subclasses with one step done the way it has shipped
wrong in real engines. Each is an adapter whose ``make_block_manager`` builds the broken manager;
everything else is infer_ref's own (the mutant records are made in ``mutants/__init__.py``)."""

from __future__ import annotations

from dataclasses import replace

from infer_ref.conformance.adapters import reference as ref
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.allocator import driver_factory
from infer_ref.engine.block_manager import BlockManager, TokenSequence

PREFIX_BUG_CLASSES = (
    "block hash not chained to its parent",
    "hit accepted without verifying token ids",
    "stale map entry on block reuse",
    "revived block loses its hash",
    "full-prompt hit computes nothing",
    "own hit evicted",
    "failed allocation leaks a ref",
    "hash published before the write",
)


class UnchainedHash(BlockManager):
    """Each block hashed from its own token ids alone: the same tokens at two depths share a hash."""

    def _parent_for_hash(self, parent_hash: int | None) -> int | None:
        return None


class UnverifiedHit(BlockManager):
    """A hash match is taken as a hit without comparing the block's token ids or its parent."""

    def _verified(self, block: int, tokens: tuple[int, ...], parent_block: int | None) -> bool:
        return True


class StaleMapEntry(BlockManager):
    """A block taken for new content keeps its old hash -> block entry."""

    def _forget(self, block: int) -> None:
        self._published.pop(block, None)
        self._epoch[block] += 1


class RevivedLosesHash(BlockManager):
    """A free cached block revived by a hit is reset like a fresh one: its hash is dropped."""

    def _take_blocks(self, hits: list[int], num_new: int) -> list[int]:
        for block in hits:
            if self.pool.is_free(block):
                self.pool.claim(block)
                self._forget(block)
            else:
                self.pool.share(block)
        return hits + self._acquire_fresh(num_new)


class FullPromptHit(BlockManager):
    """Hits may cover every full block of the prompt, the last token included: nothing is left to compute."""

    def _max_hit_blocks(self, num_tokens: int) -> int:
        return num_tokens // self.block_size


class OwnHitEvicted(BlockManager):
    """New blocks are taken before the hit blocks are claimed, so a free hit block can be handed out
    as one of the request's own new blocks."""

    def _take_blocks(self, hits: list[int], num_new: int) -> list[int]:
        fresh = self._acquire_fresh(num_new)
        for block in hits:
            if self.pool.is_free(block):
                self.pool.claim(block)
            else:
                self.pool.share(block)
        return hits + fresh


class LeakOnFailure(BlockManager):
    """Allocation claims the hits, then finds the pool exhausted and raises without giving them back."""

    def allocate(self, seq: TokenSequence) -> None:
        self._check_unallocated(seq)
        hits, hashes, _ = self._lookup_hits(seq)
        seq.block_table = self._take_blocks(hits, seq.num_blocks(self.block_size) - len(hits))
        seq.block_hashes = hashes
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size


class EarlyPublish(BlockManager):
    """Every full prompt block is hashed and published at allocation, before its K/V are written."""

    def allocate(self, seq: TokenSequence) -> None:
        super().allocate(seq)
        for i in range(len(seq.block_hashes), len(seq) // self.block_size):
            self._publish(seq, i)


def prefix_adapter(name: str, doc: str, manager_cls: type[BlockManager]) -> Adapter:
    """infer_ref's adapter with the broken block manager ``manager_cls``."""
    return replace(ref.INFER_REF, name=name, version="mutant", description=doc, make_block_manager=driver_factory(manager_cls))


PREFIX_MANAGERS: dict[str, tuple[str, type[BlockManager]]] = {
    name: (PREFIX_BUG_CLASSES[bug_class], cls)
    for name, bug_class, cls in (
        ("hash_unchained", 0, UnchainedHash),
        ("hit_unverified", 1, UnverifiedHit),
        ("stale_map_entry", 2, StaleMapEntry),
        ("revived_block_loses_hash", 3, RevivedLosesHash),
        ("full_prompt_hit", 4, FullPromptHit),
        ("own_hit_evicted", 5, OwnHitEvicted),
        ("failed_allocation_leaks", 6, LeakOnFailure),
        ("hash_published_early", 7, EarlyPublish),
    )
}
"""Mutant name -> (its bug class, the broken block manager)."""
