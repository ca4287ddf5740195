"""KVCache unit tests (writes, reads, the capacity API, every error case)."""

from __future__ import annotations

import pytest
import torch

from infer_ref import KVCache, KVCacheOverflowError, ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, tiny_config


def _kv(n: int, *, batch: int = 1, heads: int = 4, dim: int = 8, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, n, dim, generator=g).to(dtype),
        torch.randn(batch, heads, n, dim, generator=g).to(dtype),
    )


def _cache(**kw) -> KVCache:
    args = {"num_layers": 2, "num_kv_heads": 4, "head_dim": 8, "max_seq_len": 16, "device": "cpu", "dtype": torch.float32}
    args.update(kw)
    return KVCache.allocate(**args)


def _snapshot(cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, int]:
    return cache.k.clone(), cache.v.clone(), cache.seq_len


def _assert_unchanged(cache: KVCache, before: tuple[torch.Tensor, torch.Tensor, int]) -> None:
    k, v, seq_len = before
    assert cache.seq_len == seq_len
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v)


# -- allocation -------------------------------------------------------------------------------------


def test_allocate_shape_dtype_zeros() -> None:
    cache = KVCache.allocate(2, 4, 8, 16, device="cpu", dtype=torch.bfloat16)
    assert cache.k.shape == cache.v.shape == (2, 1, 4, 16, 8)
    assert cache.k.dtype == torch.bfloat16 and cache.device == torch.device("cpu")
    assert not cache.k.any() and not cache.v.any()
    assert cache.seq_len == 0 and cache.max_seq_len == 16 and cache.remaining_capacity == 16 and not cache.is_full


def test_memory_bytes_formula() -> None:
    cache = KVCache.allocate(3, 2, 8, 10, batch_size=2, device="cpu", dtype=torch.float16)
    assert cache.memory_bytes == 2 * 3 * 2 * 2 * 10 * 8 * 2


@pytest.mark.parametrize(
    ("name", "mib"),
    # docs/design.md: 1024 positions in bf16 -> Llama-3.2-1B 32 MiB (head_dim 64), Qwen3-1.7B 112 MiB (8 kv heads), Gemma 26 MiB.
    [("llama-3.2-1b", 32), ("qwen3-1.7b", 112), ("gemma-3-1b-it", 26)],
)
def test_from_model_config_real_sizes(name: str, mib: int) -> None:
    config = ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS[name])
    cache = KVCache.from_model_config(config, 1024, device="meta")
    assert cache.k.shape == (config.num_hidden_layers, 1, config.num_key_value_heads, 1024, config.computed_head_dim)
    assert cache.memory_bytes == mib * 2**20


def test_from_model_config_tiny() -> None:
    config = ModelConfig.from_hf_dict(tiny_config("qwen3"))
    cache = KVCache.from_model_config(config, 7, batch_size=3, dtype=torch.float64, device="cpu")
    assert cache.k.shape == (2, 3, 2, 7, 32) and cache.dtype == torch.float64


# -- update / advance --------------------------------------------------------------------------------


def test_prefill_then_decode_seed_plan() -> None:
    cache = _cache()
    k4, v4 = _kv(4)
    rk, rv = cache.update(0, k4, v4)
    assert rk.shape == rv.shape == (1, 4, 4, 8)
    cache.update(1, *_kv(4, seed=20))  # every layer writes before the advance
    cache.advance(4)
    assert cache.seq_len == 4
    k1, v1 = _kv(1, seed=1)
    rk, rv = cache.update(0, k1, v1)
    assert rk.shape == (1, 4, 5, 8)
    assert torch.equal(rk[:, :, :4], k4) and torch.equal(rv[:, :, :4], v4)
    assert torch.equal(rk[:, :, 4:], k1) and torch.equal(rv[:, :, 4:], v1)
    cache.update(1, *_kv(1, seed=21))
    cache.advance(1)
    assert cache.seq_len == 5 and cache.remaining_capacity == 11


def test_writes_land_at_seq_len_and_nothing_else_moves() -> None:
    cache = _cache()
    k, v = _kv(3)
    cache.update(0, k, v)
    cache.update(1, *_kv(3, seed=5))
    cache.advance(3)
    before = cache.k.clone()
    k2, v2 = _kv(2, seed=2)
    cache.update(1, k2, v2)
    changed = (cache.k != before).nonzero()
    # only layer 1, positions 3..4 may have changed
    assert set(changed[:, 0].tolist()) <= {1} and set(changed[:, 3].tolist()) <= {3, 4}
    assert torch.equal(cache.k[1, :, :, 3:5], k2)


def test_layers_are_isolated() -> None:
    cache = _cache()
    k0, v0 = _kv(2, seed=10)
    k1, v1 = _kv(2, seed=11)
    cache.update(0, k0, v0)
    cache.update(1, k1, v1)
    cache.advance(2)
    assert torch.equal(cache.k[0, :, :, :2], k0) and torch.equal(cache.k[1, :, :, :2], k1)
    assert torch.equal(cache.v[0, :, :, :2], v0) and torch.equal(cache.v[1, :, :, :2], v1)
    assert cache.k[0].data_ptr() != cache.k[1].data_ptr()


def test_batch_rows_are_isolated() -> None:
    cache = _cache(batch_size=2)
    k, v = _kv(3, batch=2)
    cache.update(0, k, v)
    assert torch.equal(cache.k[0, 0, :, :3], k[0]) and torch.equal(cache.k[0, 1, :, :3], k[1])


def test_max_seq_len_one_fills() -> None:
    cache = _cache(max_seq_len=1)
    cache.update(0, *_kv(1))
    cache.update(1, *_kv(1))
    cache.advance(1)
    assert cache.is_full and cache.remaining_capacity == 0


def test_reset_zeroes_and_restarts() -> None:
    cache = _cache()
    cache.update(0, *_kv(5))
    cache.update(1, *_kv(5))
    cache.advance(5)
    cache.reset()
    assert cache.seq_len == 0 and not cache.k.any() and not cache.v.any()
    k, v = _kv(2, seed=3)
    rk, _ = cache.update(0, k, v)
    assert torch.equal(rk, k)


# -- errors: precise, and the cache is left as it was -------------------------------------------------


def test_overflow_on_update_names_position_and_capacity() -> None:
    cache = _cache(max_seq_len=6)
    cache.update(0, *_kv(4))
    cache.update(1, *_kv(4))
    cache.advance(4)
    before = _snapshot(cache)
    with pytest.raises(KVCacheOverflowError) as err:
        cache.update(0, *_kv(3, seed=9))
    assert "writing 3 position(s) at 4 needs position 6" in str(err.value)
    assert "max_seq_len is 6" in str(err.value)
    _assert_unchanged(cache, before)


def test_overflow_on_advance() -> None:
    cache = _cache(max_seq_len=4)
    cache.update(0, *_kv(3))
    cache.update(1, *_kv(3))
    cache.advance(3)
    before = _snapshot(cache)
    with pytest.raises(KVCacheOverflowError, match="advancing by 2 from position 3 would reach 5, but max_seq_len is 4"):
        cache.advance(2)
    _assert_unchanged(cache, before)


@pytest.mark.parametrize("n", [0, -1, 1.0, True, "1"])
def test_advance_needs_positive_int(n: object) -> None:
    cache = _cache()
    with pytest.raises(ValueError, match="advance\\(n\\) needs a positive integer n"):
        cache.advance(n)  # type: ignore[arg-type]
    assert cache.seq_len == 0


@pytest.mark.parametrize("layer", [2, 99, -1, True])
def test_layer_index_out_of_range(layer: object) -> None:
    cache = _cache()
    before = _snapshot(cache)
    with pytest.raises(IndexError, match="out of range: cache has layers 0..1"):
        cache.update(layer, *_kv(1))  # type: ignore[arg-type]
    _assert_unchanged(cache, before)


@pytest.mark.parametrize(
    ("k_shape", "message"),
    [
        ((1, 3, 1, 8), "expected \\[batch=1, num_kv_heads=4, new_len>=1, head_dim=8\\]"),
        ((1, 4, 1, 16), "head_dim=8"),
        ((2, 4, 1, 8), "batch=1"),
        ((1, 4, 0, 8), "new_len>=1"),
        ((4, 1, 8), "4-D"),
    ],
)
def test_wrong_shape(k_shape: tuple[int, ...], message: str) -> None:
    cache = _cache()
    before = _snapshot(cache)
    bad = torch.zeros(k_shape)
    with pytest.raises(ValueError, match=message):
        cache.update(0, bad, bad)
    _assert_unchanged(cache, before)


def test_k_and_v_shapes_must_match() -> None:
    cache = _cache()
    k, _ = _kv(2)
    _, v = _kv(3)
    with pytest.raises(ValueError, match="k and v shapes differ"):
        cache.update(0, k, v)
    assert not cache.k.any()


def test_wrong_dtype() -> None:
    cache = _cache()
    before = _snapshot(cache)
    with pytest.raises(TypeError, match="k has dtype torch.float64, cache holds torch.float32"):
        cache.update(0, *_kv(1, dtype=torch.float64))
    _assert_unchanged(cache, before)


def test_wrong_device() -> None:
    cache = _cache()
    k = torch.zeros(1, 4, 1, 8, device="meta")
    with pytest.raises(ValueError, match="k is on meta, cache is on cpu"):
        cache.update(0, k, k)
    assert cache.seq_len == 0


def test_not_a_tensor() -> None:
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        _cache().update(0, [1.0], [1.0])  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"max_seq_len": 0}, {"num_layers": -1}, {"head_dim": 2.5}])
def test_allocate_rejects_bad_dims(bad: dict) -> None:
    with pytest.raises(ValueError, match="cache dimensions must be positive integers"):
        _cache(**bad)


def test_constructor_validates() -> None:
    k = torch.zeros(1, 1, 1, 4, 2)
    with pytest.raises(ValueError, match="seq_len must be an integer in \\[0, 4\\], got 5"):
        KVCache(k, k.clone(), seq_len=5)
    with pytest.raises(ValueError, match="must both be"):
        KVCache(k, torch.zeros(1, 1, 1, 5, 2))


def test_constructor_rejects_k_and_v_sharing_memory() -> None:
    # The same tensor for K and V, or overlapping views of one buffer: V would overwrite K.
    k = torch.zeros(1, 1, 1, 4, 2)
    with pytest.raises(ValueError, match="k and v overlap in memory"):
        KVCache(k, k)
    buf = torch.zeros(1, 1, 1, 6, 2)
    with pytest.raises(ValueError, match="k and v overlap in memory"):
        KVCache(buf[:, :, :, :4], buf[:, :, :, 2:])
    apart = torch.zeros(2, 1, 1, 1, 4, 2)
    KVCache(apart[0], apart[1])  # two halves of one allocation that never meet are fine


def test_constructor_rejects_aliased_layers() -> None:
    shared = torch.zeros(1, 1, 2, 4, 8).expand(3, 1, 2, 4, 8)
    with pytest.raises(ValueError, match="broadcasts one storage slice"):
        KVCache(shared, torch.zeros(3, 1, 2, 4, 8))
