"""The block manager's arithmetic and bookkeeping, each value from the specification in its docstring.

The conformance kit's state machine judges allocation against a model of the pool; these pin what
it does not look at: the hash bytes, the hit counters, the refusals of ``commit`` and
``block_hash``, what ``deallocate`` leaves behind and the minimal pool of ``with_blocks``.
"""

from __future__ import annotations

import struct

import pytest
import xxhash

from infer_ref.engine.block_manager import BlockManager, TokenSequence, block_hash, chain_hashes


def _spec_hash(parent: int | None, tokens: list[int]) -> int:
    """The docstring's formula, written with struct: parent as u64 LE, then each id as i64 LE, seed 0."""
    head = b"" if parent is None else struct.pack("<Q", parent)
    return xxhash.xxh64_intdigest(head + struct.pack(f"<{len(tokens)}q", *tokens), seed=0)


@pytest.mark.parametrize("parent", [None, 0, 1, 2**64 - 1, 0x0123456789ABCDEF])
def test_block_hash_is_the_documented_xxh64_of_little_endian_bytes(parent: int | None) -> None:
    tokens = [0, 1, 255, 256, 2**40 + 7, 2**63 - 1]
    assert block_hash(parent, tokens) == _spec_hash(parent, tokens)


@pytest.mark.parametrize("parent", [-1, 2**64, 2**65, 3**64])
def test_block_hash_refuses_a_parent_outside_u64(parent: int) -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        block_hash(parent, [1])


@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "3", 2**63, 2**64])
def test_block_hash_refuses_a_token_that_is_not_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integers"):
        block_hash(None, [2, bad])  # type: ignore[list-item]


def test_a_manager_caches_prefixes_unless_told_not_to() -> None:
    pool = BlockManager.with_blocks(2, 2).pool
    assert BlockManager(pool).enable_prefix_caching is True


def test_chain_hashes_folds_the_full_blocks_and_skips_the_partial_one() -> None:
    tokens = list(range(11))  # block size 4: blocks [0..3], [4..7] full, [8..10] partial
    h0 = _spec_hash(None, [0, 1, 2, 3])
    h1 = _spec_hash(h0, [4, 5, 6, 7])
    assert chain_hashes(tokens, 4) == [h0, h1]
    assert chain_hashes(tokens[:3], 4) == []
    calls: list[tuple[int | None, list[int]]] = []

    def recording(parent: int | None, ids: object) -> int:
        calls.append((parent, list(ids)))  # type: ignore[call-overload]
        return len(calls) * 10

    assert chain_hashes(list(range(9)), 3, recording) == [10, 20, 30]
    assert calls == [(None, [0, 1, 2]), (10, [3, 4, 5]), (20, [6, 7, 8])]


def _committed(blocks: BlockManager, tokens: list[int]) -> TokenSequence:
    seq = TokenSequence(list(tokens))
    blocks.allocate(seq)
    blocks.commit(seq, len(tokens))
    return seq


def test_hit_counters_accumulate_over_requests() -> None:
    blocks = BlockManager.with_blocks(16, 4)
    first = _committed(blocks, list(range(10)))  # 10 tokens: (10-1)//4 = 2 blocks queried, none cached
    second = TokenSequence([*range(9), 99])  # same first 8 tokens: 2 queried, 2 hit, 8 tokens cached
    blocks.allocate(second)
    third = TokenSequence([50, 51, 52, 53, 54])  # (5-1)//4 = 1 queried, no hit
    blocks.allocate(third)
    stats = blocks.stats
    assert (stats.block_queries, stats.block_hits) == (2 + 2 + 1, 0 + 2 + 0)
    assert (stats.prompt_tokens, stats.cached_tokens) == (10 + 10 + 5, 0 + 8 + 0)
    assert stats.hit_rate == 8 / 25
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 8


def test_without_prefix_caching_nothing_is_queried_published_or_hit() -> None:
    blocks = BlockManager.with_blocks(8, 4, enable_prefix_caching=False)
    assert blocks.enable_prefix_caching is False
    first = _committed(blocks, list(range(9)))
    assert blocks.cached_blocks() == {} and blocks.published(first.block_table[0]) is None
    blocks.allocate(TokenSequence(list(range(9))))
    assert (blocks.stats.block_queries, blocks.stats.block_hits, blocks.stats.cached_tokens) == (0, 0, 0)


def test_published_records_hash_tokens_and_parent() -> None:
    blocks = BlockManager.with_blocks(4, 2)
    seq = _committed(blocks, [7, 8, 9, 10, 11])
    h0 = _spec_hash(None, [7, 8])
    first = blocks.published(seq.block_table[0])
    second = blocks.published(seq.block_table[1])
    assert first is not None and (first.hash, first.token_ids, first.parent) == (h0, (7, 8), None)
    assert second is not None and (second.hash, second.token_ids) == (_spec_hash(h0, [9, 10]), (9, 10))
    assert second.parent is not None and second.parent[0] == seq.block_table[0]
    assert blocks.published(seq.block_table[2]) is None  # the partial block is never published


def test_can_append_needs_one_free_block_only_when_the_last_block_is_full() -> None:
    blocks = BlockManager.with_blocks(3, 2)
    seq = TokenSequence([1, 2, 3, 4])  # 2 blocks: one left free
    blocks.allocate(seq)
    seq.token_ids.append(5)  # needs a third block: exactly one is free
    assert blocks.pool.num_free == 1 and blocks.can_append(seq)
    blocks.append(seq)
    seq.token_ids.append(6)  # fits the third block: no free block needed
    assert blocks.pool.num_free == 0 and blocks.can_append(seq)
    seq.token_ids.append(7)
    assert not blocks.can_append(seq)


@pytest.mark.parametrize("bad", [-1, 0, 6, True, 2.0, "3"])
def test_commit_refuses_a_count_outside_already_computed_to_length(bad: object) -> None:
    blocks = BlockManager.with_blocks(4, 2)
    seq = TokenSequence([1, 2, 3, 4, 5])
    blocks.allocate(seq)
    blocks.commit(seq, 2)
    before = (seq.num_computed_tokens, list(seq.block_hashes), blocks.cached_blocks())
    with pytest.raises(ValueError, match=r"num_computed_tokens must be an integer in \[2, 5\]"):
        blocks.commit(seq, bad)  # type: ignore[arg-type]
    assert (seq.num_computed_tokens, seq.block_hashes, blocks.cached_blocks()) == before


def test_commit_accepts_the_count_already_computed_and_the_full_length() -> None:
    blocks = BlockManager.with_blocks(4, 2)
    seq = TokenSequence([1, 2, 3, 4, 5])
    blocks.allocate(seq)
    blocks.commit(seq, 0)
    blocks.commit(seq, 3)
    blocks.commit(seq, 3)  # nothing new written: allowed, publishes nothing more
    assert seq.num_computed_tokens == 3 and len(seq.block_hashes) == 1
    blocks.commit(seq, 5)
    assert len(seq.block_hashes) == 2


def test_deallocate_leaves_an_empty_sequence_that_can_be_allocated_again() -> None:
    blocks = BlockManager.with_blocks(4, 2)
    seq = _committed(blocks, [1, 2, 3, 4, 5])
    blocks.deallocate(seq)
    assert seq.block_table == [] and seq.block_hashes == []
    assert seq.num_cached_tokens == 0 and seq.num_computed_tokens == 0
    assert seq.token_ids == [1, 2, 3, 4, 5] and blocks.pool.num_free == 4
    blocks.allocate(seq)  # readmitted after preemption: hits its own 2 published blocks
    assert seq.num_cached_tokens == 4 and seq.num_computed_tokens == 4


def test_with_blocks_holds_one_float32_scalar_per_position() -> None:
    blocks = BlockManager.with_blocks(5, 3)
    # K and V, one layer, one head, head_dim 1, 4 bytes each: 2 * 5 blocks * 3 positions * 4 bytes.
    assert blocks.pool.k.nbytes + blocks.pool.v.nbytes == 2 * 5 * 3 * 4
    assert (blocks.num_blocks, blocks.block_size, blocks.enable_prefix_caching) == (5, 3, True)
