"""PagedKVCache: slot mapping, block tables over a shared pool, views with per-row lengths, refusals."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache import BlockPool, KVCacheOverflowError, PagedKVCache, PoolExhaustedError

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
