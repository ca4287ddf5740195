"""BlockPool: free-list order, reference counts, refusals that change nothing, sizing."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache import BlockPool, PoolExhaustedError
from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config


def _pool(num_blocks: int = 6, free_order: list[int] | None = None) -> BlockPool:
    return BlockPool.allocate(2, 1, 4, num_blocks, 3, dtype=torch.float32, device="cpu", free_order=free_order)


def _state(pool: BlockPool) -> tuple[list[int], list[int]]:
    return pool.free_block_ids(), [pool.ref_count(b) for b in range(pool.num_blocks)]


def test_acquire_takes_from_the_head_and_release_appends_to_the_tail() -> None:
    pool = _pool(6, free_order=[3, 1, 0, 2, 5, 4])
    assert pool.acquire(2) == [3, 1]
    assert pool.free_block_ids() == [0, 2, 5, 4]
    pool.release([1, 3])  # in the order given: 1 then 3
    assert pool.free_block_ids() == [0, 2, 5, 4, 1, 3]
    assert pool.acquire(4) == [0, 2, 5, 4]  # least recently freed first


def test_conservation_and_ref_counts() -> None:
    pool = _pool(5)
    a = pool.acquire(3)
    pool.share(a[0])
    assert pool.num_free + pool.num_used == pool.num_blocks == 5
    assert [pool.ref_count(b) for b in a] == [2, 1, 1]
    pool.release([a[0]])
    assert not pool.is_free(a[0]) and pool.ref_count(a[0]) == 1
    pool.release(a)
    assert pool.num_free == 5 and all(pool.ref_count(b) == 0 for b in range(5))


def test_claim_takes_a_specific_free_block_without_reordering_the_rest() -> None:
    pool = _pool(5)
    pool.claim(2)
    assert pool.free_block_ids() == [0, 1, 3, 4] and pool.ref_count(2) == 1


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        (lambda p: p.acquire(7), PoolExhaustedError, "7 block\\(s\\) requested, 6 free of 6"),
        (lambda p: p.acquire(-1), ValueError, "non-negative integer"),
        (lambda p: p.acquire(True), ValueError, "non-negative integer"),
        (lambda p: p.release([0]), ValueError, "double free\\): block 0 held 0 time"),
        (lambda p: p.release([6]), IndexError, "block id 6 out of range"),
        (lambda p: p.release([-1]), IndexError, "block id -1 out of range"),
        (lambda p: p.share(0), ValueError, "block 0 is free"),
        (lambda p: p.claim(9), IndexError, "out of range"),
    ],
)
def test_refusals_change_nothing(action: object, error: type[Exception], match: str) -> None:
    pool = _pool(6)
    before = _state(pool)
    with pytest.raises(error, match=match):
        action(pool)  # type: ignore[operator]
    assert _state(pool) == before


def test_partial_double_free_is_refused_as_a_whole() -> None:
    pool = _pool(4)
    a = pool.acquire(2)
    before = _state(pool)
    with pytest.raises(ValueError, match=f"block {a[1]} held 1 time\\(s\\), released 2"):
        pool.release([a[0], a[1], a[1]])
    assert _state(pool) == before


def test_claim_of_a_used_block_is_refused() -> None:
    pool = _pool(4)
    (b,) = pool.acquire(1)
    with pytest.raises(ValueError, match=f"block {b} is not free"):
        pool.claim(b)
    assert pool.ref_count(b) == 1


def test_pool_exhausted_is_an_overflow() -> None:
    assert issubclass(PoolExhaustedError, KVCacheOverflowError)


def test_free_order_must_be_a_permutation() -> None:
    with pytest.raises(ValueError, match="permutation of 0..3"):
        _pool(4, free_order=[0, 1, 1, 2])


def test_sizes_and_memory_budget() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("qwen3"))
    itemsize = 8
    per_block = 2 * config.num_hidden_layers * 4 * config.num_key_value_heads * config.computed_head_dim * itemsize
    pool = BlockPool.from_memory_budget(config, 3 * per_block + per_block // 2, 4, dtype=torch.float64, device="cpu")
    assert pool.num_blocks == 3 and pool.bytes_per_block == per_block
    assert pool.memory_bytes == 3 * per_block
    with pytest.raises(ValueError, match="holds no block"):
        BlockPool.from_memory_budget(config, per_block - 1, 4, dtype=torch.float64, device="cpu")


def test_k_and_v_must_not_share_memory() -> None:
    buf = torch.zeros(1, 2, 2, 1, 4)
    with pytest.raises(ValueError, match="overlap in memory"):
        BlockPool(buf, buf)
