"""Block hashes of the prefix cache: the chain definition, depth sensitivity, full blocks only,
stability across processes, and the manager's bad-input errors."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import xxhash

from infer_ref.cache.pool import PoolExhaustedError
from infer_ref.engine.block_manager import BlockManager, TokenSequence, block_hash, chain_hashes


def _oracle(parent: int | None, ids: list[int]) -> int:
    """The definition written out: xxh64(parent as <Q ‖ ids as <q...), seed 0."""
    head = b"" if parent is None else struct.pack("<Q", parent)
    return xxhash.xxh64_intdigest(head + struct.pack(f"<{len(ids)}q", *ids), seed=0)


def test_block_hash_is_the_documented_byte_layout() -> None:
    ids = [1, 128255, 262143, 0]
    assert block_hash(None, ids) == _oracle(None, ids)
    parent = 0xFEDCBA9876543210
    assert block_hash(parent, ids) == _oracle(parent, ids)


def test_chain_is_h0_of_tokens_then_hi_of_parent_and_tokens() -> None:
    ids = [5, 6, 7, 8, 9, 10, 11]  # two full blocks of 3, one partial
    h0 = _oracle(None, [5, 6, 7])
    h1 = _oracle(h0, [8, 9, 10])
    assert chain_hashes(ids, 3) == [h0, h1]  # the partial block [11] has no hash


def test_same_tokens_at_two_depths_or_after_two_prefixes_hash_differently() -> None:
    block = [4, 4]
    hashes = chain_hashes(block * 3, 2)
    assert len(set(hashes)) == 3
    assert chain_hashes([1, 1, *block], 2)[1] != chain_hashes([2, 2, *block], 2)[1]


def test_only_full_blocks_are_hashed() -> None:
    assert chain_hashes([1, 2, 3], 4) == []
    assert len(chain_hashes(list(range(8)), 4)) == 2
    assert len(chain_hashes(list(range(9)), 4)) == 2


def test_hashes_are_stable_across_processes() -> None:
    """No random seed: two fresh interpreters (different PYTHONHASHSEEDs) give the same values."""
    code = "from infer_ref.engine.block_manager import chain_hashes; print(chain_hashes(list(range(40)), 16))"
    outs = []
    for seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**_env(), "PYTHONHASHSEED": seed}
        )
        outs.append(proc.stdout.strip())
    assert outs[0] == outs[1] == str(chain_hashes(list(range(40)), 16))
    assert outs[0] == str([_oracle(None, list(range(16))), _oracle(_oracle(None, list(range(16))), list(range(16, 32)))])


def _env() -> dict[str, str]:
    return dict(os.environ)


@pytest.mark.parametrize("bad", [[-1], [1.5], [True]])
def test_bad_token_ids_are_refused(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="non-negative integers"):
        block_hash(None, bad)  # type: ignore[arg-type]


def test_manager_refuses_bad_use_and_changes_nothing() -> None:
    manager = BlockManager.with_blocks(3, 2)
    with pytest.raises(ValueError, match="empty sequence"):
        manager.allocate(TokenSequence([]))
    seq = TokenSequence([1, 2, 3])
    manager.allocate(seq)
    with pytest.raises(ValueError, match="already holds blocks"):
        manager.allocate(seq)
    with pytest.raises(ValueError, match=r"num_computed_tokens must be an integer in \[0, 3\]"):
        manager.commit(seq, 4)
    big = TokenSequence([9] * 5)
    free_before = manager.pool.free_block_ids()
    with pytest.raises(PoolExhaustedError, match="3 free block"):
        manager.allocate(big)
    assert manager.pool.free_block_ids() == free_before and big.block_table == []
    seq.token_ids += [4, 5, 6, 7]  # four tokens (two new blocks) without an append in between
    with pytest.raises(ValueError, match="one at a time"):
        manager.append(seq)
    with pytest.raises(RuntimeError, match="in use"):
        manager.reset()


def test_counters_count_blocks_and_tokens() -> None:
    manager = BlockManager.with_blocks(8, 2)
    a = TokenSequence([1, 2, 3, 4, 5])
    manager.allocate(a)
    manager.commit(a, 5)
    b = TokenSequence([1, 2, 3, 4, 6, 7])
    manager.allocate(b)
    # a: 2 blocks queryable, 0 hits; b: 2 queryable ((6-1)//2), 2 hits.
    s = manager.stats
    assert (s.block_queries, s.block_hits, s.prompt_tokens, s.cached_tokens) == (4, 2, 11, 4)
    assert s.hit_rate == pytest.approx(4 / 11)


def test_without_prefix_caching_nothing_is_published_or_hit() -> None:
    manager = BlockManager.with_blocks(8, 2, enable_prefix_caching=False)
    a = TokenSequence([1, 2, 3, 4, 5])
    manager.allocate(a)
    manager.commit(a, 5)
    b = TokenSequence([1, 2, 3, 4, 5])
    manager.allocate(b)
    assert b.num_cached_tokens == 0 and manager.cached_blocks() == {}
    assert set(a.block_table).isdisjoint(b.block_table)
