"""PagedKVCache: slot mapping, block tables over a shared pool, views with per-row lengths, refusals."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache import BlockPool, KVCacheOverflowError, PagedKVCache, PoolExhaustedError
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config

L, H, D, BS = 2, 2, 4, 3


def _pool(num_blocks: int = 8, free_order: list[int] | None = None) -> BlockPool:
    return BlockPool.allocate(L, H, D, num_blocks, BS, dtype=torch.float64, device="cpu", free_order=free_order)


def _entry(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randn(b, H, t, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _forward(cache: PagedKVCache, t: int, seed: int) -> list[torch.Tensor]:
    """One forward's writes: every layer's K (V = -K), then advance; returns the K written per layer."""
    ks = []
    for layer in range(L):
        k = _entry(cache.batch_size, t, seed + layer)
        cache.update(layer, k, -k)
        ks.append(k)
    cache.advance(t)
    return ks


def test_slots_follow_the_block_table() -> None:
    pool = _pool(8, free_order=[5, 2, 7, 0, 1, 3, 4, 6])
    cache = PagedKVCache(pool)
    _forward(cache, 7, 0)  # 7 positions need 3 blocks of 3: taken from the head of the free list
    assert cache.block_tables == [[5, 2, 7]]
    # slot(p) = table[p // bs] * bs + p % bs
    assert cache.slot_mapping(range(7)) == [15, 16, 17, 6, 7, 8, 21]


def test_update_returns_what_was_written_in_order() -> None:
    cache = PagedKVCache(_pool(8, free_order=[6, 1, 4, 0, 7, 2, 3, 5]), batch_size=2)
    first = _forward(cache, 4, 0)
    k_new = _entry(2, 2, 50)
    k, v = cache.update(1, k_new, -k_new)
    assert torch.equal(k, torch.cat((first[1], k_new), dim=2)) and torch.equal(v, -k)


def test_the_written_entries_sit_in_the_pool_at_their_slots() -> None:
    pool = _pool(8, free_order=[3, 6, 1, 0, 2, 4, 5, 7])
    cache = PagedKVCache(pool)
    (k0, _k1) = _forward(cache, 5, 0)
    flat = pool.k[0].reshape(-1, H, D)  # [num_blocks * bs, Hkv, D]
    for pos, slot in enumerate(cache.slot_mapping(range(5))):
        assert torch.equal(flat[slot], k0[0, :, pos])


def test_two_caches_share_one_pool_without_touching_each_other() -> None:
    pool = _pool(8)
    a, b = PagedKVCache(pool), PagedKVCache(pool)
    ka = _forward(a, 4, 0)
    kb = _forward(b, 5, 100)
    assert not {x for t in a.block_tables for x in t} & {x for t in b.block_tables for x in t}
    assert pool.num_used == 4  # 2 blocks each
    assert torch.equal(a.get_kv(0)[0], ka[0]) and torch.equal(b.get_kv(1)[0], kb[1])
    a.reset()
    assert pool.num_used == 2 and torch.equal(b.get_kv(0)[0], kb[0])


def test_reset_and_crop_return_blocks_tail_first() -> None:
    pool = _pool(6)
    cache = PagedKVCache(pool)
    _forward(cache, 8, 0)
    table = cache.block_tables[0]  # [0, 1, 2]
    cache.crop(2)  # keeps ceil(2/3) = 1 block
    assert cache.block_tables == [[table[0]]] and pool.free_block_ids()[-2:] == [table[2], table[1]]
    cache.reset()
    assert pool.free_block_ids()[-1] == table[0] and pool.num_free == 6


def test_memory_counts_blocks_held_and_used_bytes_counts_positions() -> None:
    pool = _pool(8)
    cache = PagedKVCache(pool, batch_size=2)
    _forward(cache, 4, 0)  # 2 rows * ceil(4/3) = 4 blocks
    per_block = 2 * L * BS * H * D * 8
    assert cache.memory_bytes == 4 * per_block
    assert cache.used_bytes == 2 * L * 2 * H * 4 * D * 8


def test_pool_exhaustion_refuses_and_changes_nothing() -> None:
    pool = _pool(3)
    cache = PagedKVCache(pool, max_seq_len=100)
    _forward(cache, 6, 0)
    before = (cache.block_tables, cache.seq_len, pool.free_block_ids(), pool.k.clone())
    with pytest.raises(PoolExhaustedError, match="2 block\\(s\\) requested, 1 free"):
        cache.update(0, _entry(1, 4, 9), _entry(1, 4, 10))
    assert (cache.block_tables, cache.seq_len, pool.free_block_ids()) == before[:3]
    assert torch.equal(pool.k, before[3])


def test_overflow_names_position_and_capacity() -> None:
    cache = PagedKVCache(_pool(8), max_seq_len=5)
    _forward(cache, 4, 0)
    with pytest.raises(KVCacheOverflowError, match="max_seq_len is 5"):
        cache.update(0, _entry(1, 2, 1), _entry(1, 2, 2))
    assert cache.seq_len == 4 and cache.remaining_capacity == 1


def test_a_view_writes_into_given_blocks_with_per_row_lengths() -> None:
    pool = _pool(8)
    ta, tb = pool.acquire(3), pool.acquire(1)
    a = PagedKVCache.over_blocks(pool, [ta], [0])
    ka = _forward(a, 7, 0)
    b = PagedKVCache.over_blocks(pool, [tb], [0])
    kb = _forward(b, 2, 10)
    batch = PagedKVCache.over_blocks(pool, [ta, tb], [7, 2])
    assert batch.lengths == [7, 2] and batch.seq_len == 7
    positions = batch.positions(1)
    assert positions.tolist() == [[7], [2]]
    k_new = _entry(2, 1, 99)
    k, _ = batch.update(0, k_new, -k_new)  # [2, H, 8, D]: row b padded after its own 3 positions
    assert torch.equal(k[0], torch.cat((ka[0][0], k_new[0]), dim=1))
    assert torch.equal(k[1, :, :3], torch.cat((kb[0][0], k_new[1]), dim=1))
    mask = batch.attention_mask(1, None)  # [B, T, S]: row 1 sees only its 3 keys
    assert mask.shape == (2, 1, 8) and mask[1, 0].tolist() == [True] * 3 + [False] * 5
    assert pool.num_used == 4  # the view took no block


def test_advance_over_positions_a_layer_did_not_write_is_refused_and_changes_nothing() -> None:
    pool = _pool(8)
    cache = PagedKVCache(pool)
    _forward(cache, 2, 0)
    k = _entry(1, 3, 7)
    cache.update(0, k, -k)  # layer 1 never writes positions 2..4
    tables, used = cache.block_tables, pool.num_used
    with pytest.raises(ValueError, match=r"advance\(3\) from 2 needs every layer .* layer\(s\) \[1\] wrote 0"):
        cache.advance(3)
    assert cache.lengths == [2] and cache.block_tables == tables and pool.num_used == used
    cache.update(1, k, -k)
    cache.advance(2)  # part of what every layer wrote
    with pytest.raises(ValueError, match=r"layer\(s\) \[0, 1\] wrote 1"):
        cache.advance(2)
    cache.advance(1)
    assert cache.lengths == [5] and torch.equal(cache.get_kv(1)[0][..., 2:, :], k)


def test_advance_without_any_write_takes_no_block() -> None:
    pool = _pool(8)
    cache = PagedKVCache(pool)
    with pytest.raises(ValueError, match=r"advance\(1\) from 0 needs every layer"):
        cache.advance(1)
    view = PagedKVCache.over_blocks(pool, [pool.acquire(1), pool.acquire(1)], [1, 2])
    with pytest.raises(ValueError, match=r"from lengths \[1, 2\] .* layer\(s\) \[0, 1\] wrote 0"):
        view.advance(1)
    assert cache.seq_len == 0 and cache.num_blocks_held == 0 and view.lengths == [1, 2] and pool.num_used == 2


def test_a_view_never_takes_or_frees_blocks() -> None:
    pool = _pool(8)
    table = pool.acquire(1)
    view = PagedKVCache.over_blocks(pool, [table], [3])
    with pytest.raises(KVCacheOverflowError, match="cannot take blocks"):
        view.update(0, _entry(1, 1, 0), _entry(1, 1, 1))
    with pytest.raises(TypeError, match="view over blocks"):
        view.reset()
    assert pool.num_used == 1 and view.lengths == [3]


def test_a_view_refuses_free_blocks_and_short_tables() -> None:
    pool = _pool(8)
    with pytest.raises(ValueError, match="block 0 is free"):
        PagedKVCache.over_blocks(pool, [[0]], [1])
    table = pool.acquire(1)
    with pytest.raises(ValueError, match="4 positions need 2 blocks, table has 1"):
        PagedKVCache.over_blocks(pool, [table], [4])


def test_layer_windows_are_validated() -> None:
    with pytest.raises(ValueError, match="positive window or None"):
        PagedKVCache(_pool(), layer_windows=[None, 0])
    with pytest.raises(ValueError, match="each of the 2 layers"):
        PagedKVCache(_pool(), layer_windows=[4])


# -- construction: what each constructor passes on, its defaults, its refusals ------------------------


def test_default_capacity_splits_the_pool_among_rows_in_whole_blocks() -> None:
    cache = PagedKVCache(_pool(7), batch_size=2)
    assert cache.max_seq_len == (7 // 2) * BS == 9 and isinstance(cache.max_seq_len, int)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda pool: PagedKVCache(pool, batch_size=0), r"^batch_size needs a positive integer n, got 0"),
        (lambda pool: PagedKVCache(pool, max_seq_len=0), r"^max_seq_len needs a positive integer n, got 0"),
        (lambda pool: PagedKVCache(pool).advance(0), r"^advance\(n\) needs a positive integer n, got 0"),
        (lambda pool: PagedKVCache.over_blocks(pool, [], []), r"one block table per length, got 0 tables and 0 lengths"),
        (lambda pool: PagedKVCache.over_blocks(pool, [pool.acquire(1)], [-1]), r"^lengths\[0\] needs a non-negative integer n, got -1"),
    ],
    ids=["batch_size", "max_seq_len", "advance", "no-tables", "negative-length"],
)
def test_bad_counts_are_refused_naming_the_argument(build: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(_pool())  # type: ignore[operator]


def test_a_view_refuses_what_only_an_owner_may_do_naming_the_call() -> None:
    pool = _pool(8)
    source = PagedKVCache(pool)
    _forward(source, 2, 0)
    snap = source.snapshot()
    view = PagedKVCache.over_blocks(pool, [pool.acquire(1)], [1])
    used = pool.num_used
    for call, act in [("reset", view.reset), ("release", view.release), ("crop", lambda: view.crop(0)),
                      ("restore", lambda: view.restore(snap))]:  # fmt: skip
        with pytest.raises(TypeError, match=rf"^{call} refused: this cache is a view over blocks"):
            act()
    assert view.lengths == [1] and pool.num_used == used


def test_repr_tells_an_owning_cache_from_a_view() -> None:
    """The repr is the one public place that says whether a cache owns its blocks (a view refuses
    reset and crop), so a user printing a cache must see it."""
    pool = _pool(8)
    owning = PagedKVCache(pool, max_seq_len=6)
    view = PagedKVCache.over_blocks(pool, [pool.acquire(1)], [2])
    assert repr(owning).startswith("PagedKVCache(owning, batch=1, lengths=[0], blocks=0, block_size=3, max_seq_len=6, pool=BlockPool(")
    assert repr(view).startswith("PagedKVCache(view, batch=1, lengths=[2], blocks=1, block_size=3, max_seq_len=3, pool=BlockPool(")


def test_a_view_keeps_its_layer_windows() -> None:
    pool = _pool(8)
    view = PagedKVCache.over_blocks(pool, [pool.acquire(1)], [1], layer_windows=[None, 2])
    assert view.layer_windows == [None, 2]


# -- the step: what every layer's write and a paged kernel read -----------------------------------------


def test_a_step_carries_t_and_the_tables_and_lengths_as_int32() -> None:
    pool = _pool(8, free_order=[5, 2, 7, 0, 1, 3, 4, 6])
    cache = PagedKVCache(pool)
    step = cache.plan_step(2, [None, None])  # 2 positions: one block, taken from the head
    assert step.t == 2 and step.block_tables.dtype == torch.int32 and step.lengths.dtype == torch.int32
    assert step.block_tables.tolist() == [[5]] and step.lengths.tolist() == [2]
    assert step.positions.tolist() == [0, 1]  # [T]: every row alike
    assert pool.acquire(4) == [2, 7, 0, 1]
    view = PagedKVCache.over_blocks(pool, [[2, 7, 0], [1]], [7, 2])  # rows of 3 and 1 blocks
    step = view.plan_step(1, [None, None])
    assert step.block_tables.tolist() == [[2, 7, 0], [1, -1, -1]]  # -1 past a row's blocks
    assert step.lengths.tolist() == [8, 3] and step.positions.tolist() == [[7], [2]]  # [B, T]: per row


def test_the_slots_are_computed_once_per_forward() -> None:
    """The step's plan is made at the first call and every layer's write reuses it (the docstring's
    promise: a step costs a few small kernels, not a plan per layer)."""
    cache = PagedKVCache(_pool(8), batch_size=2)
    _forward(cache, 2, 0)
    step = cache.plan_step(3, [None, None])
    k = _entry(2, 3, 5)
    plans = [cache.write(layer, k, -k) for layer in range(L)]
    assert all(plan.table is step.block_tables for plan in plans)


def test_a_forward_abandoned_after_one_layer_is_replaced_by_the_next() -> None:
    """Layer 0 writes 2 positions and the forward stops (an error upstream); the next forward of 3
    positions at the same lengths writes and reads its own 3, at every layer."""
    cache = PagedKVCache(_pool(8))
    _forward(cache, 2, 0)
    k = _entry(1, 2, 1)
    cache.update(0, k, -k)  # never advanced
    ks = _forward(cache, 3, 10)
    assert cache.lengths == [5]
    for layer in range(L):
        assert torch.equal(cache.get_kv(layer)[0][..., 2:, :], ks[layer])


def test_update_stores_through_the_store_it_is_given() -> None:
    cache = PagedKVCache(_pool(8))
    calls: list[int] = []

    def store(k: torch.Tensor, v: torch.Tensor, k_dest: torch.Tensor, v_dest: torch.Tensor, slots: torch.Tensor) -> None:
        calls.append(slots.numel())
        k_dest.reshape(-1, H, D)[slots] = k
        v_dest.reshape(-1, H, D)[slots] = v

    k = _entry(1, 2, 3)
    out, _ = cache.update(0, k, -k, store=store)
    assert calls == [2] and torch.equal(out, k)


def test_a_cache_on_the_meta_device_keeps_every_tensor_there() -> None:
    """Sizing without memory (``device="meta"``, as ``resolve`` allows): the pool, each step's
    positions, masks, tables and lengths, what update and get_kv return, and a materialized snapshot
    all live on the cache's device. On this CPU-only machine the meta device is the one way to see a
    tensor made on the default device instead of the cache's."""
    pool = BlockPool.allocate(L, H, D, 8, BS, dtype=torch.float64, device="meta")
    assert pool.k.device.type == pool.v.device.type == "meta"
    cache = PagedKVCache(pool, batch_size=2)
    step = cache.plan_step(2, [None, 2])
    mask = step.masks(2)
    assert mask is not None
    for t in (step.positions, step.lengths, step.block_tables, mask):
        assert t is not None and t.device.type == "meta"
    k = torch.zeros(2, H, 2, D, dtype=torch.float64, device="meta")
    for layer in range(L):
        assert all(t.device.type == "meta" for t in cache.update(layer, k, k))
    cache.advance(2)
    assert cache.positions(1).device.type == "meta" and cache.get_kv(0)[0].device.type == "meta"
    assert cache.snapshot().materialize().pool.device.type == "meta"
    view = PagedKVCache.over_blocks(pool, [pool.acquire(2), pool.acquire(1)], [4, 2])  # rows of unequal length
    mask = view.attention_mask(1, None)
    assert view.positions(1).device.type == "meta" and mask is not None and mask.device.type == "meta"


def test_from_model_config_passes_every_setting_on() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("gemma3_text"))  # sliding layers: windows [6, 6, None, 6]
    cache = PagedKVCache.from_model_config(config, 5, 3, batch_size=2, dtype=torch.float64, device="cpu", max_seq_len=7,
                                           free_order=[4, 3, 2, 1, 0])  # fmt: skip
    assert (cache.block_size, cache.pool.num_blocks, cache.batch_size, cache.max_seq_len) == (3, 5, 2, 7)
    assert cache.dtype == torch.float64 and cache.layer_windows == [6, 6, None, 6]
    assert cache.pool.free_block_ids() == [4, 3, 2, 1, 0]
    default = PagedKVCache.from_model_config(config, 4)
    assert (default.block_size, default.batch_size, default.max_seq_len, default.dtype) == (16, 1, 4 * 16, torch.bfloat16)
    meta = PagedKVCache.from_model_config(config, 2, device="meta")
    assert meta.pool.device.type == "meta"


def test_from_memory_budget_takes_the_blocks_the_budget_holds() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("gemma3_text"))
    per_block = 2 * config.num_hidden_layers * 3 * config.num_key_value_heads * config.computed_head_dim * 8  # float64, bs 3
    cache = PagedKVCache.from_memory_budget(config, 3 * per_block + per_block - 1, 3, batch_size=2, dtype=torch.float64, device="cpu")
    assert (cache.pool.num_blocks, cache.block_size, cache.batch_size, cache.max_seq_len) == (3, 3, 2, (3 // 2) * 3)
    assert cache.dtype == torch.float64 and cache.layer_windows == [6, 6, None, 6]
    per_block_default = 2 * config.num_hidden_layers * 16 * config.num_key_value_heads * config.computed_head_dim * 2  # bf16, bs 16
    default = PagedKVCache.from_memory_budget(config, 2 * per_block_default)
    assert (default.pool.num_blocks, default.block_size, default.batch_size, default.dtype) == (2, 16, 1, torch.bfloat16)
    meta = PagedKVCache.from_memory_budget(config, per_block, 3, dtype=torch.float64, device="meta")
    assert meta.pool.device.type == "meta"


# -- snapshots: what a materialized cache keeps of its source -------------------------------------------


def test_a_materialized_snapshot_keeps_block_size_pool_capacity_and_windows() -> None:
    source = PagedKVCache(_pool(10), batch_size=2, max_seq_len=11, layer_windows=[None, 2])
    ks = _forward(source, 5, 0)
    copy = source.snapshot().materialize()
    assert isinstance(copy, PagedKVCache)
    assert (copy.block_size, copy.pool.num_blocks, copy.max_seq_len, copy.layer_windows) == (BS, 10, 11, [None, 2])
    assert copy.lengths == [5, 5] and all(torch.equal(copy.get_kv(i)[0], ks[i]) for i in range(L))


def _snapshot(batch: int, seq_len: int, settings: dict[str, int]) -> KVSnapshot:
    keys = _entry(L * batch, seq_len, 1).reshape(L, batch, H, seq_len, D)
    return KVSnapshot(keys, -keys, PagedKVCache, settings)


@pytest.mark.parametrize(
    ("batch", "seq_len", "settings", "block_size", "num_blocks"),
    [
        (2, 20, {}, 16, 2 * 2),  # no settings (a snapshot built by hand): blocks of 16, 2 rows * ceil(20 / 16)
        (2, 0, {}, 16, 1),  # nothing to hold: one block all the same (a pool has at least one)
        (1, 7, {"block_size": 3, "num_blocks": 1}, 3, 3),  # recorded pool too small: ceil(7 / 3) blocks
    ],
    ids=["no-settings", "empty", "pool-too-small"],
)
def test_a_snapshot_materializes_with_the_blocks_its_positions_need(
    batch: int, seq_len: int, settings: dict[str, int], block_size: int, num_blocks: int
) -> None:
    snap = _snapshot(batch, seq_len, settings)
    cache = PagedKVCache.from_snapshot(snap)
    assert (cache.block_size, cache.pool.num_blocks, cache.layer_windows) == (block_size, num_blocks, None)
    assert cache.max_seq_len == (num_blocks // batch) * block_size and cache.lengths == [seq_len] * batch
    if seq_len:
        assert torch.equal(cache.get_kv(1)[0], snap.keys[1]) and torch.equal(cache.get_kv(1)[1], snap.values[1])
