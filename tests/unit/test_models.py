"""Model forward contract (docs/design.md): shapes, the cache protocol calls, and input errors."""

from __future__ import annotations

import pytest
import torch

from infer_ref import KVCache, KVCacheOverflowError, load_model
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, WeightInit, random_snapshot, tiny_config


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    folder = random_snapshot(tmp_path_factory.mktemp(request.param), tiny_config(request.param), seed=3, init=WeightInit(gain=2.0))
    model, _ = load_model(folder, dtype=torch.float64, device="cpu")
    return model


def _cache(model, max_seq_len: int = 16, batch: int = 1) -> KVCache:
    return KVCache.from_model_config(model.config, max_seq_len, batch_size=batch, dtype=torch.float64, device="cpu")


class CountingCache(KVCache):
    """Records the calls a forward makes."""

    def __init__(self, base: KVCache) -> None:
        super().__init__(base.k, base.v)
        self.updates: list[tuple[int, int]] = []
        self.advances: list[int] = []

    def update(self, layer_idx, k, v):
        self.updates.append((layer_idx, k.shape[2]))
        return super().update(layer_idx, k, v)

    def advance(self, n: int) -> None:
        self.advances.append(n)
        super().advance(n)


def test_shapes_with_and_without_cache(model) -> None:
    ids = torch.randint(0, 128, (2, 6))
    vocab = model.config.vocab_size
    assert model(ids).shape == (2, 6, vocab)
    cache = _cache(model, batch=2)
    assert model(ids, cache).shape == (2, 1, vocab)
    assert model(ids[:, :2], cache, all_logits=True).shape == (2, 2, vocab)
    assert cache.seq_len == 8


def test_each_layer_writes_once_then_one_advance(model) -> None:
    cache = CountingCache(_cache(model))
    model(torch.randint(0, 128, (1, 5)), cache)
    layers = model.config.num_hidden_layers
    assert cache.updates == [(i, 5) for i in range(layers)]
    assert cache.advances == [5]


def test_cached_last_logits_equal_full_last_row(model) -> None:
    ids = torch.randint(0, 128, (1, 9))
    full = model(ids)
    cache = _cache(model)
    model(ids[:, :4], cache)
    chunk = model(ids[:, 4:], cache, all_logits=True)
    torch.testing.assert_close(chunk, full[:, 4:], rtol=0, atol=1e-10)


def test_forward_refuses_overflow_before_writing(model) -> None:
    cache = _cache(model, max_seq_len=6)
    model(torch.randint(0, 128, (1, 4)), cache)
    k_before = cache.k.clone()
    with pytest.raises(KVCacheOverflowError, match="3 new token\\(s\\) at position 4 need capacity 7, but max_seq_len is 6"):
        model(torch.randint(0, 128, (1, 3)), cache)
    assert cache.seq_len == 4 and torch.equal(cache.k, k_before)


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        (torch.zeros(5, dtype=torch.long), ValueError, "must be a \\[batch, seq_len>=1\\] tensor, got \\(5,\\)"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "got \\(1, 0\\)"),
        (torch.zeros(1, 3), TypeError, "must be int64 or int32 token ids, got torch.float32"),
    ],
)
def test_bad_input_ids(model, ids, error, message) -> None:
    cache = _cache(model)
    with pytest.raises(error, match=message):
        model(ids, cache)
    assert cache.seq_len == 0


def test_cache_batch_and_layers_must_match(model) -> None:
    with pytest.raises(ValueError, match="input batch 2 does not match the cache's batch 1"):
        model(torch.zeros(2, 3, dtype=torch.long), _cache(model))
    wrong_layers = KVCache.allocate(model.config.num_hidden_layers + 1, model.config.num_key_value_heads,
                                    model.config.computed_head_dim, 8, dtype=torch.float64, device="cpu")
    with pytest.raises(ValueError, match="cache has .* layers, model has"):
        model(torch.zeros(1, 3, dtype=torch.long), wrong_layers)


def test_config_is_set(model) -> None:
    assert model.config.model_type in FAMILIES
