"""DynamicKVCache: growth by concatenation, memory counted by positions held, crop, refusals."""

from __future__ import annotations

import pytest
import torch

from infer_ref.cache import DynamicKVCache

L, B, H, D = 3, 2, 2, 4
ITEMSIZE = 8  # float64


def _cache() -> DynamicKVCache:
    return DynamicKVCache(L, H, D, batch_size=B, dtype=torch.float64, device="cpu")


def _entry(t: int, seed: int) -> torch.Tensor:
    return torch.randn(B, H, t, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _write(cache: DynamicKVCache, t: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    written = []
    for layer in range(L):
        k, v = _entry(t, seed + 2 * layer), _entry(t, seed + 2 * layer + 1)
        cache.update(layer, k, v)
        written.append((k, v))
    cache.advance(t)
    return written


def test_empty_layer_is_zero_length() -> None:
    k, v = _cache().get_kv(1)
    assert k.shape == v.shape == (B, H, 0, D)


def test_update_returns_the_concatenation() -> None:
    cache = _cache()
    first = _write(cache, 5, 0)
    k_new, v_new = _entry(2, 100), _entry(2, 101)
    k, v = cache.update(1, k_new, v_new)
    assert torch.equal(k, torch.cat((first[1][0], k_new), dim=2))
    assert torch.equal(v, torch.cat((first[1][1], v_new), dim=2))


def test_memory_grows_linearly_with_positions() -> None:
    cache = _cache()
    sizes = [cache.memory_bytes]
    for step in range(4):
        _write(cache, 3, 10 * step)
        sizes.append(cache.memory_bytes)
    # 2 (K, V) * L * B * Hkv * seq_len * D * itemsize, seq_len = 0, 3, 6, 9, 12
    assert sizes == [2 * L * B * H * n * D * ITEMSIZE for n in (0, 3, 6, 9, 12)]
    assert cache.used_bytes == cache.memory_bytes


def test_crop_keeps_the_first_positions_and_frees_the_rest() -> None:
    cache = _cache()
    written = _write(cache, 6, 0)
    cache.crop(4)
    assert cache.seq_len == 4
    assert cache.memory_bytes == 2 * L * B * H * 4 * D * ITEMSIZE
    for layer in range(L):
        k, v = cache.get_kv(layer)
        assert torch.equal(k, written[layer][0][:, :, :4]) and torch.equal(v, written[layer][1][:, :, :4])
    # Writing after a crop lands at position 4.
    k_new = _entry(1, 7)
    k, _ = cache.update(0, k_new, k_new.clone())
    assert torch.equal(k[:, :, 4:], k_new)


def test_a_forward_that_failed_half_way_leaves_no_positions() -> None:
    cache = _cache()
    _write(cache, 2, 0)
    cache.update(0, _entry(3, 5), _entry(3, 6))  # layer 0 wrote, then the forward died
    k, _ = cache.update(0, _entry(1, 7), _entry(1, 8))  # the retry writes at seq_len again
    assert k.shape[2] == 3


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        (lambda c: c.crop(5), ValueError, "exceeds seq_len 4"),
        (lambda c: c.crop(-1), ValueError, "non-negative integer"),
        (lambda c: c.advance(1), ValueError, "needs every layer to hold 5 positions"),
        (lambda c: c.advance(0), ValueError, "positive integer"),
        (lambda c: c.update(3, _entry(1, 0), _entry(1, 1)), IndexError, "layer index 3 out of range"),
        (lambda c: c.update(0, _entry(1, 0).float(), _entry(1, 1).float()), TypeError, "dtype torch.float32"),
        (lambda c: c.update(0, torch.zeros(B, H, 0, D, dtype=torch.float64), torch.zeros(B, H, 0, D, dtype=torch.float64)), ValueError, "new_len>=1"),
    ],
)
def test_refusals_change_nothing(action: object, error: type[Exception], match: str) -> None:
    cache = _cache()
    _write(cache, 4, 0)
    before = [tuple(t.clone() for t in cache.get_kv(i)) for i in range(L)]
    with pytest.raises(error, match=match):
        action(cache)  # type: ignore[operator]
    assert cache.seq_len == 4
    for i in range(L):
        assert all(torch.equal(a, b) for a, b in zip(cache.get_kv(i), before[i], strict=True))


def test_reset_empties_every_layer() -> None:
    cache = _cache()
    _write(cache, 4, 0)
    cache.reset()
    assert cache.seq_len == 0 and cache.memory_bytes == 0
    assert cache.get_kv(2)[0].shape == (B, H, 0, D)
