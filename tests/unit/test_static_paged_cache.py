"""StaticPagedKVCache unit tests: construction, its argument checks, crop, reset, release, snapshots.

Its writes and reads through the model are judged elsewhere (the fast decode step, the kit's
cache properties); here each member is called directly on a small pool, with expected values
stated as arithmetic on the pool's geometry.
"""

from __future__ import annotations

import pytest
import torch

from infer_ref import ModelConfig
from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.dynamic import DynamicKVCache
from infer_ref.cache.pool import BlockPool
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.conformance.checkpoints.snapshots import tiny_config

LAYERS, HEADS, DIM = 2, 1, 2
# A scrambled free list: logically consecutive blocks are not physically consecutive.
ORDER = [5, 2, 7, 0, 3, 6, 1, 4]


def _pool() -> BlockPool:
    """8 blocks of 4 positions, handed out in ``ORDER``."""
    return BlockPool.allocate(LAYERS, HEADS, DIM, 8, 4, dtype=torch.float32, device="cpu", free_order=ORDER)


def _fill(cache: StaticPagedKVCache, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Write ``n`` random positions into every layer and commit them; returns what each layer got."""
    g = torch.Generator().manual_seed(seed)
    written = []
    for layer in range(cache.num_layers):
        k = torch.randn(cache.batch_size, HEADS, n, DIM, generator=g)
        v = torch.randn(cache.batch_size, HEADS, n, DIM, generator=g)
        cache.update(layer, k, v)
        written.append((k, v))
    cache.advance(n)
    return written


# -- construction ------------------------------------------------------------------------------------


def test_blocks_taken_from_the_head_of_the_free_list() -> None:
    # 2 rows of ceil(6 / 4) = 2 blocks: the first 4 ids of the free list, row-major in the table.
    pool = _pool()
    cache = StaticPagedKVCache(pool, 6, batch_size=2)
    assert cache.block_table.tolist() == [[5, 2], [7, 0]]
    assert cache.block_table.dtype == torch.int32 and cache.block_table.device == pool.device
    assert pool.num_free == 8 - 4
    assert cache.memory_bytes == 4 * pool.bytes_per_block == 4 * 2 * LAYERS * 4 * HEADS * DIM * 4
    assert (cache.batch_size, cache.max_seq_len, cache.seq_len, int(cache.pos)) == (2, 6, 0, 0)


def test_one_row_by_default() -> None:
    pool = _pool()
    cache = StaticPagedKVCache(pool, 5)
    assert cache.batch_size == 1 and cache.block_table.shape == (1, 2) and pool.num_free == 6


@pytest.mark.parametrize("name", ["max_seq_len", "batch_size"])
@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_size_refused_pool_unchanged(name: str, bad: object) -> None:
    pool = _pool()
    args = {"max_seq_len": 4, "batch_size": 1, name: bad}
    with pytest.raises(ValueError, match=rf"^{name} must be a positive integer, got {bad!r}$"):
        StaticPagedKVCache(pool, args["max_seq_len"], batch_size=args["batch_size"])
    assert pool.num_free == 8


def test_layer_windows_kept_and_checked() -> None:
    cache = StaticPagedKVCache(_pool(), 4, layer_windows=(3, None))
    assert cache.layer_windows == [3, None]
    assert cache.snapshot().settings["layer_windows"] == [3, None]
    pool = _pool()
    with pytest.raises(ValueError, match="layer_windows must give each of the 2 layers"):
        StaticPagedKVCache(pool, 4, layer_windows=[3])
    assert pool.num_free == 8


def test_built_where_the_pool_is() -> None:
    pool = BlockPool.allocate(LAYERS, HEADS, DIM, 2, 4, dtype=torch.float32, device="meta")
    cache = StaticPagedKVCache(pool, 8)
    assert cache.device == cache.block_table.device == cache.pos.device == torch.device("meta")
    assert cache.plan_step(1, [None, None]).positions.device == torch.device("meta")


def test_from_model_config_sizes_and_windows() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("gemma3_text"))  # windows (6, 6, None, 6)
    cache = StaticPagedKVCache.from_model_config(config, 10, block_size=4, batch_size=2, dtype=torch.float32, device="cpu",
                                                 free_order=[5, 4, 3, 2, 1, 0])  # fmt: skip
    # A pool of exactly 2 rows * ceil(10 / 4) = 6 blocks, taken in the given free order.
    assert cache.pool.num_blocks == 6 and cache.pool.num_free == 0 and cache.block_size == 4
    assert cache.block_table.tolist() == [[5, 4, 3], [2, 1, 0]]
    assert cache.layer_windows == [6, 6, None, 6]
    assert (cache.num_layers, cache.num_kv_heads, cache.head_dim) == (4, 1, 32)


def test_from_model_config_defaults_and_device() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("llama"))
    cache = StaticPagedKVCache.from_model_config(config, 20, device="meta")
    assert cache.block_size == 16 and cache.batch_size == 1 and cache.pool.num_blocks == 2
    assert cache.device == torch.device("meta") and cache.dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["block_size", "max_seq_len"])
@pytest.mark.parametrize("bad", [0, -1, True])
def test_from_model_config_bad_size_refused(name: str, bad: object) -> None:
    config = ModelConfig.from_hf_dict(tiny_config("llama"))
    args = {"max_seq_len": 8, "block_size": 4, name: bad}
    with pytest.raises(ValueError, match=rf"^{name} must be a positive integer, got {bad!r}$"):
        StaticPagedKVCache.from_model_config(config, args["max_seq_len"], block_size=args["block_size"], device="cpu")


# -- crop, reset, release ----------------------------------------------------------------------------


def test_crop_keeps_a_prefix() -> None:
    cache = StaticPagedKVCache(_pool(), 8)
    written = _fill(cache, 6)
    cache.crop(2)
    assert cache.seq_len == 2 and int(cache.pos) == 2
    for layer, (k, v) in enumerate(written):
        got_k, got_v = cache.get_kv(layer)
        assert torch.equal(got_k, k[:, :, :2]) and torch.equal(got_v, v[:, :, :2])
    with pytest.raises(ValueError, match="n=3 exceeds seq_len 2"):
        cache.crop(3)
    with pytest.raises(ValueError, match=r"crop\(n\) needs a non-negative integer n, got -1"):
        cache.crop(-1)
    assert cache.seq_len == 2 and int(cache.pos) == 2


def test_reset_zeroes_its_own_blocks_only() -> None:
    pool = _pool()
    mine, other = StaticPagedKVCache(pool, 8), StaticPagedKVCache(pool, 8)
    _fill(mine, 7, seed=1)
    kept = _fill(other, 5, seed=2)
    mine.reset()
    assert mine.seq_len == 0 and int(mine.pos) == 0
    ids = mine.block_table.flatten().long()
    assert not pool.k[:, ids].any() and not pool.v[:, ids].any()
    for layer, (k, v) in enumerate(kept):  # the other cache's blocks in the same pool are untouched
        got_k, got_v = other.get_kv(layer)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
    written = _fill(mine, 3, seed=3)  # and the reset cache is usable from position 0
    assert torch.equal(mine.get_kv(1)[0], written[1][0])


def test_release_returns_every_block() -> None:
    pool = _pool()
    cache = StaticPagedKVCache(pool, 8, batch_size=2)
    held = cache.block_table.flatten().tolist()
    cache.release()
    assert pool.num_free == 8 and cache.memory_bytes == 0
    assert all(pool.ref_count(b) == 0 for b in held)


def test_repr_names_the_type() -> None:
    assert repr(StaticPagedKVCache(_pool(), 8)).startswith("StaticPagedKVCache(layers=2, batch=1, kv_heads=1")


# -- snapshots ---------------------------------------------------------------------------------------


def test_snapshot_round_trip_keeps_block_size_capacity_and_windows() -> None:
    cache = StaticPagedKVCache(_pool(), 10, batch_size=2, layer_windows=[None, 3])
    written = _fill(cache, 7)
    snap = cache.snapshot()
    assert snap.settings == {"max_seq_len": 10, "block_size": 4, "layer_windows": [None, 3]}
    copy = StaticPagedKVCache.from_snapshot(snap)
    assert (copy.block_size, copy.max_seq_len, copy.seq_len, int(copy.pos)) == (4, 10, 7, 7)
    assert copy.layer_windows == [None, 3]
    assert copy.pool.num_blocks == 2 * 3 and copy.device == torch.device("cpu")
    for layer, (k, v) in enumerate(written):
        got_k, got_v = copy.get_kv(layer)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)


def test_from_a_snapshot_without_paged_settings() -> None:
    # A dynamic cache's snapshot names no capacity and no block size: the capacity is what it
    # holds (at least 1) and the block size the default, 16.
    source = DynamicKVCache(LAYERS, HEADS, DIM, dtype=torch.float32, device="cpu")
    k = torch.randn(1, HEADS, 1, DIM)
    for layer in range(LAYERS):
        source.update(layer, k, k)
    source.advance(1)
    copy = StaticPagedKVCache.from_snapshot(source.snapshot())
    assert (copy.max_seq_len, copy.block_size, copy.seq_len, copy.layer_windows) == (1, 16, 1, None)
    assert torch.equal(copy.get_kv(0)[0], k)
    contiguous = KVCache.allocate(LAYERS, HEADS, DIM, 5, dtype=torch.float32, device="cpu")
    assert StaticPagedKVCache.from_snapshot(contiguous.snapshot()).block_size == 16


def test_from_a_snapshot_on_its_device() -> None:
    cache = StaticPagedKVCache(BlockPool.allocate(LAYERS, HEADS, DIM, 2, 4, dtype=torch.float32, device="meta"), 8)
    copy = StaticPagedKVCache.from_snapshot(cache.snapshot())
    assert copy.device == copy.pool.k.device == torch.device("meta")
