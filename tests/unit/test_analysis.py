"""FLOPs and cache bytes (``infer_ref.analysis``) against sums written out independently.

The brute-force counter below walks every forward of a generation, layer by layer and query by
query, counting multiply-adds of each matrix product from its shapes (``m × k @ k × n`` is
``m·k·n``) and the visible keys by the window definition (key ``j`` visible from position ``p`` iff
``j <= p`` and ``p - j < window``); it shares nothing with the closed forms under test.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.analysis import (
    FlopsComparison,
    attention_flops_for_query,
    flops_comparison,
    kv_cache_bytes,
    projection_flops_per_position,
)
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config

MIB = 2**20

# Published config.json values (the fields the cache size and the FLOPs depend on).
LLAMA_3_2_1B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}  # fmt: skip
QWEN3_1_7B = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "rope_theta": 1000000.0, "use_sliding_window": False,
}  # fmt: skip
GEMMA_3_1B = {
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
}  # fmt: skip


def _macs(m: int, k: int, n: int) -> int:
    return m * k * n


def _brute_force_forward(c: ModelConfig, positions: list[int]) -> tuple[int, int]:
    """(projection FLOPs, attention FLOPs) of one forward computing ``positions``."""
    t, hidden, d = len(positions), c.hidden_size, c.computed_head_dim
    h, hkv = c.num_attention_heads, c.num_key_value_heads
    proj = attn = 0
    for layer in range(c.num_hidden_layers):
        window = c.sliding_window if c.layer_types[layer] == "sliding_attention" else None
        proj += _macs(t, hidden, h * d) + _macs(t, hidden, hkv * d) + _macs(t, hidden, hkv * d)  # Q, K, V
        proj += _macs(t, h * d, hidden)  # O
        proj += _macs(t, hidden, c.intermediate_size) * 2 + _macs(t, c.intermediate_size, hidden)  # gate, up, down
        for p in positions:
            keys = sum(1 for j in range(p + 1) if window is None or p - j < window)
            attn += h * (_macs(1, d, keys) + _macs(1, keys, d))  # scores, then weights @ V
    proj += _macs(t, hidden, c.vocab_size)  # LM head
    return 2 * proj, 2 * attn


def _brute_force(c: ModelConfig, prompt_len: int, n_tokens: int) -> FlopsComparison:
    without = [_brute_force_forward(c, list(range(prompt_len + i))) for i in range(n_tokens)]
    cached = [_brute_force_forward(c, list(range(prompt_len)))]
    cached += [_brute_force_forward(c, [prompt_len + i - 1]) for i in range(1, n_tokens)]
    return FlopsComparison(
        prompt_len, n_tokens,
        projection_without_cache=sum(p for p, _ in without), attention_without_cache=sum(a for _, a in without),
        projection_with_cache=sum(p for p, _ in cached), attention_with_cache=sum(a for _, a in cached),
    )  # fmt: skip


def _tiny(family: str, **overrides: object) -> ModelConfig:
    return ModelConfig.from_hf_dict(tiny_config(family, **overrides))


@given(
    family=st.sampled_from(["llama", "qwen3", "gemma3_text"]),
    prompt_len=st.integers(1, 12),
    n_tokens=st.integers(1, 12),
)
def test_flops_equal_the_brute_force_count(family: str, prompt_len: int, n_tokens: int) -> None:
    """Every field, every family (Gemma's tiny config slides with a small window, crossed here)."""
    config = _tiny(family)
    assert flops_comparison(prompt_len, n_tokens, config) == _brute_force(config, prompt_len, n_tokens)


def test_a_worked_example_by_hand() -> None:
    """hidden 2, one head of dim 2, intermediate 3, vocab 5, one layer; prompt 1, two tokens.

    Per position: Q, K, V, O 2·2·2 = 8 each (32), MLP 3·(2·2·3) = 36, LM head 2·2·5 = 20: 88.
    Without a cache: forwards over 1 and 2 positions, 3 projected positions = 264; attention 8 per
    visible key (2 products · 2·D), keys 1 + (1 + 2) = 4: 32. Total 296.
    With a cache: 2 projected positions = 176; attention 1 key (prefill) + 2 keys (step 1): 24.
    Total 200; speedup 1.48.
    """
    config = ModelConfig.from_hf_dict(
        {"model_type": "llama", "vocab_size": 5, "hidden_size": 2, "intermediate_size": 3,
         "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1}
    )  # fmt: skip
    got = flops_comparison(1, 2, config)
    assert (got.projection_without_cache, got.attention_without_cache) == (264, 32)
    assert (got.projection_with_cache, got.attention_with_cache) == (176, 24)
    assert (got.total_without_cache, got.total_with_cache) == (296, 200)
    assert got.speedup == pytest.approx(1.48, rel=1e-12)


@pytest.mark.parametrize("prompt_len, n_tokens", [(1, 1), (7, 30), (100, 400)])
def test_full_attention_closed_forms(prompt_len: int, n_tokens: int) -> None:
    """Llama-3.2-1B (no window): Σ over steps as a loop vs the textbook closed forms.

    Projection: c·Σ_i (P + i) = c·(nP + n(n-1)/2) without, c·(P + n - 1) with.
    Attention per layer and head, 4·D per key: Σ_i L_i(L_i + 1)/2 without;
    P(P+1)/2 + Σ_{i>=1} (P + i) with.
    """
    c = ModelConfig.from_hf_dict(LLAMA_3_2_1B)
    p, n = prompt_len, n_tokens
    per_position = 2 * (
        c.num_hidden_layers * (2048 * 2048 + 2 * 2048 * 512 + 2048 * 2048 + 3 * 2048 * 8192) + 2048 * 128256
    )  # Q and O 2048×2048, K and V 2048×(8·64), MLP 3 × 2048×8192, LM head 2048×128256
    per_key = 4 * 32 * 64 * 16  # heads · D · layers
    got = flops_comparison(p, n, c)
    assert projection_flops_per_position(c) == per_position
    assert got.projection_without_cache == per_position * (n * p + n * (n - 1) // 2)
    assert got.projection_with_cache == per_position * (p + n - 1)
    loop_without = sum((p + i) * (p + i + 1) // 2 for i in range(n))
    assert got.attention_without_cache == per_key * loop_without
    assert got.attention_with_cache == per_key * (p * (p + 1) // 2 + sum(p + i for i in range(1, n)))


def test_sliding_layers_attend_over_their_window_only() -> None:
    """Gemma-3-1b: past the window, a decode step's attention grows only through its global layers."""
    c = ModelConfig.from_hf_dict(GEMMA_3_1B)
    sliding = sum(c.is_sliding(i) for i in range(26))
    assert sliding == 26 - 4  # every sixth layer is global (5, 11, 17, 23)
    per_layer_key = 4 * 4 * 256
    at = {pos: attention_flops_for_query(c, pos) for pos in (100, 511, 512, 2000)}
    assert at[100] == 26 * per_layer_key * 101
    assert at[511] == 26 * per_layer_key * 512
    assert at[2000] == (sliding * 512 + (26 - sliding) * 2001) * per_layer_key
    assert at[2000] - at[512] == (26 - sliding) * per_layer_key * (2000 - 512)


@pytest.mark.parametrize("hf", [LLAMA_3_2_1B, QWEN3_1_7B, GEMMA_3_1B], ids=["llama", "qwen3", "gemma3"])
def test_speedup_grows_with_sequence_length(hf: dict) -> None:
    c = ModelConfig.from_hf_dict(hf)
    assert flops_comparison(64, 1, c).speedup == 1.0  # one token: the prefill is all either way
    speedups = [flops_comparison(64, n, c).speedup for n in (2, 16, 128, 1024)]
    assert all(a < b for a, b in itertools.pairwise(speedups)), speedups
    assert speedups[-1] > 10


@pytest.mark.parametrize(
    "hf, mib", [(LLAMA_3_2_1B, 32), (QWEN3_1_7B, 112), (GEMMA_3_1B, 26)], ids=["llama", "qwen3", "gemma3"]
)
def test_cache_bytes_of_the_real_models_at_1024_positions(hf: dict, mib: int) -> None:
    """2 · layers · kv_heads · 1024 · head_dim · 2 bytes: 2·16·8·1024·64·2, 2·28·8·1024·128·2, 2·26·1·1024·256·2."""
    c = ModelConfig.from_hf_dict(hf)
    assert kv_cache_bytes(c, 1024, torch.bfloat16) == mib * MIB
    assert kv_cache_bytes(c, 1024, torch.float32, batch_size=3) == 3 * 2 * mib * MIB
    assert kv_cache_bytes(c, 0, torch.bfloat16) == 0


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda c: flops_comparison(0, 5, c), ValueError, "prompt_len must be an int >= 1, got 0"),
        (lambda c: flops_comparison(5, 0, c), ValueError, "n_tokens must be an int >= 1, got 0"),
        (lambda c: flops_comparison(5, True, c), ValueError, "n_tokens must be an int >= 1, got True"),
        (lambda c: flops_comparison(5.0, 3, c), ValueError, "prompt_len must be an int >= 1, got 5.0"),
        (lambda c: flops_comparison(5, 3, LLAMA_3_2_1B), TypeError, "config must be a ModelConfig, got dict"),
        (lambda c: kv_cache_bytes(c, -1, torch.bfloat16), ValueError, "seq_len must be an int >= 0, got -1"),
        (lambda c: kv_cache_bytes(c, 8, torch.bfloat16, batch_size=0), ValueError, "batch_size must be an int >= 1"),
        (lambda c: kv_cache_bytes(c, 8, "bfloat16"), TypeError, "dtype must be a torch.dtype, got 'bfloat16'"),
    ],
)
def test_bad_arguments_are_refused(call, error: type, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=re.escape(message)):
        call(ModelConfig.from_hf_dict(LLAMA_3_2_1B))
