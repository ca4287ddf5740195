"""BlockPool: free-list order, reference counts, refusals that change nothing, sizing."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache import BlockPool, PoolExhaustedError
from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.cache.pool import free_gpu_budget
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


def test_acquire_of_nothing_takes_nothing() -> None:
    pool = _pool(4)
    before = _state(pool)
    assert pool.acquire(0) == [] and _state(pool) == before


@pytest.mark.parametrize("bad", [True, 1.0])
def test_a_block_id_must_be_an_int(bad: object) -> None:
    pool = _pool(4)
    with pytest.raises(IndexError, match=f"block id {bad!r} out of range"):
        pool.is_free(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [[True, 0], [0, 1.0]], ids=["bool", "float"])
def test_free_order_entries_must_be_ints(order: list[object]) -> None:
    with pytest.raises(ValueError, match="permutation of 0..1"):
        _pool(2, free_order=order)  # type: ignore[arg-type]


@pytest.mark.parametrize("dim", ["num_layers", "num_kv_heads", "head_dim", "num_blocks", "block_size"])
def test_allocate_refuses_each_empty_dimension_by_name(dim: str) -> None:
    dims = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 4, "num_blocks": 3, "block_size": 2, dim: 0}
    with pytest.raises(ValueError, match=f"cache dimensions must be positive integers, got {{'{dim}': 0}}"):
        BlockPool.allocate(**dims, dtype=torch.float32, device="cpu")


def test_k_and_v_of_the_wrong_rank_are_refused_naming_the_layout() -> None:
    with pytest.raises(ValueError, match=r"must both be \[num_layers, num_blocks, block_size, num_kv_heads, head_dim\]"):
        BlockPool(torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 2, 4))


def test_a_double_free_of_several_blocks_names_each() -> None:
    pool = _pool(4)
    with pytest.raises(ValueError, match=r"block 0 held 0 time\(s\), released 1, block 1 held 0 time\(s\), released 1$"):
        pool.release([0, 1])


def test_constructors_pass_their_settings_on_and_default_to_blocks_of_16() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("qwen3"))
    assert BlockPool.allocate(1, 1, 1, 2, device="cpu").block_size == 16
    pool = BlockPool.from_model_config(config, 3, free_order=[2, 0, 1], device="cpu")
    assert pool.block_size == 16 and pool.free_block_ids() == [2, 0, 1]
    per_block = 2 * config.num_hidden_layers * 16 * config.num_key_value_heads * config.computed_head_dim * 2  # bf16, bs 16
    assert BlockPool.from_memory_budget(config, 2 * per_block, device="cpu").block_size == 16
    for pool in (
        BlockPool.allocate(1, 1, 1, 2, device="meta"),
        BlockPool.from_model_config(config, 2, device="meta"),
        BlockPool.from_memory_budget(config, 2 * per_block, device="meta"),
    ):
        assert pool.k.device.type == pool.v.device.type == "meta"


@pytest.mark.parametrize(
    ("budget", "match"),
    [
        (0, "budget_bytes must be a positive integer, got 0"),
        (-1, "budget_bytes must be a positive integer, got -1"),
        (1e9, "budget_bytes must be a positive integer, got 1000000000.0"),
        (True, "budget_bytes must be a positive integer, got True"),
        (1, "a budget of 1 bytes holds no block"),
    ],
)
def test_memory_budget_refusals(budget: object, match: str) -> None:
    config = ModelConfig.from_hf_dict(tiny_config("qwen3"))
    with pytest.raises(ValueError, match=match):
        BlockPool.from_memory_budget(config, budget, 4, dtype=torch.float64, device="cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_free_gpu_budget_refuses_a_fraction_outside_0_1(fraction: float) -> None:
    with pytest.raises(ValueError, match=f"fraction must be in \\(0, 1\\], got {fraction}"):
        free_gpu_budget(fraction)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("fraction", [None, 0.5, 1.0])
def test_free_gpu_budget_needs_cuda(fraction: float | None) -> None:
    """Every fraction in (0, 1], 1 included, and the default, passes the check and meets the CUDA one."""
    with pytest.raises(RuntimeError, match="free_gpu_budget needs a CUDA device"):
        free_gpu_budget() if fraction is None else free_gpu_budget(fraction)


def test_free_gpu_budget_is_the_fraction_of_the_free_memory_of_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA's report stood in (free 4000 of 8000 bytes): fraction * free, of the device asked for."""
    asked: list[torch.device] = []

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        asked.append(device)
        return 4000, 8000

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert free_gpu_budget() == 3600  # the default fraction 0.9
    assert free_gpu_budget(0.25, "cuda:1") == 1000
    assert asked == [torch.device("cuda"), torch.device("cuda:1")]
