"""Attention with a KV cache, masks, RoPE, norms: against full recompute and float64 math."""

from __future__ import annotations

import math

import pytest
import torch

from infer_ref import KVCache, ModelConfig
from infer_ref.attention import HeadTransform, grouped_query_attention
from infer_ref.config import RopeConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config
from infer_ref.masks import attention_mask, visible_keys
from infer_ref.models.common import (
    Attention,
    GemmaRMSNorm,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
    apply_rope_to_pair,
    rope_inv_freq,
)
from infer_ref.step import contiguous_step

DTYPE = torch.float64


def _attention(num_kv_heads: int = 2, qk_norm: bool = False, seed: int = 0) -> Attention:
    config = ModelConfig.from_hf_dict(
        tiny_config("llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=num_kv_heads)
    )
    torch.manual_seed(seed)
    attn = Attention(config, RMSNorm if qk_norm else None).to(DTYPE)
    if qk_norm:
        for norm in (attn.q_norm, attn.k_norm):
            assert norm is not None
            torch.nn.init.normal_(norm.weight, 1.0, 0.2)
    return attn


def _rope(head_dim: int = 8) -> RotaryEmbedding:
    return RotaryEmbedding(head_dim, RopeConfig(theta=10_000.0))


def _full(attn: Attention, x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    t = x.shape[1]
    cos, sin = _rope()(torch.arange(t), DTYPE)
    return attn(x, cos, sin, contiguous_step(0, t, [window], "cpu"))


def _chunked(attn: Attention, x: torch.Tensor, chunks: list[int], window: int | None = None) -> torch.Tensor:
    cache = KVCache.allocate(1, attn.num_kv_heads, 8, x.shape[1], batch_size=x.shape[0], dtype=DTYPE, device="cpu")
    outs, start = [], 0
    for n in chunks:
        positions = torch.arange(start, start + n)
        cos, sin = _rope()(positions, DTYPE)
        outs.append(attn(x[:, start : start + n], cos, sin, contiguous_step(start, n, [window], "cpu"), cache, 0))
        cache.advance(n)
        start += n
    return torch.cat(outs, dim=1)


def test_prefill_then_decode_shapes_and_seq_len() -> None:
    attn = _attention()
    x = torch.randn(1, 5, 32, dtype=DTYPE)
    cache = KVCache.allocate(1, 2, 8, 8, dtype=DTYPE, device="cpu")
    cos, sin = _rope()(torch.arange(4), DTYPE)
    assert attn(x[:, :4], cos, sin, contiguous_step(0, 4, [None], "cpu"), cache, 0).shape == (1, 4, 32)
    cache.advance(4)
    cos, sin = _rope()(torch.arange(4, 5), DTYPE)
    assert attn(x[:, 4:], cos, sin, contiguous_step(4, 1, [None], "cpu"), cache, 0).shape == (1, 1, 32)
    cache.advance(1)
    assert cache.seq_len == 5


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("chunks", [[4, 1], [2, 1, 1, 1], [1, 1, 1, 1, 1], [3, 2], [5]])
def test_cached_equals_full_sequence(num_kv_heads: int, chunks: list[int]) -> None:
    attn = _attention(num_kv_heads, qk_norm=True)
    x = torch.randn(2, 5, 32, dtype=DTYPE)
    torch.testing.assert_close(_chunked(attn, x, chunks), _full(attn, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunks", [[3, 1, 1, 1, 1, 1, 1, 1, 1, 1], [4, 3, 3, 2], [1] * 12])
def test_cached_equals_full_with_sliding_window(chunks: list[int]) -> None:
    attn = _attention()
    x = torch.randn(1, 12, 32, dtype=DTYPE)
    full = _full(attn, x, window=3)
    torch.testing.assert_close(_chunked(attn, x, chunks, window=3), full, rtol=0, atol=1e-12)
    # and the window matters: without it, late positions differ
    assert (full[:, 6:] - _full(attn, x)[:, 6:]).abs().max() > 1e-3


def test_attention_matches_float64_formula() -> None:
    """softmax(q k^T * scale + causal) v, written out by hand, with GQA heads shared."""
    attn = _attention(num_kv_heads=2)
    x = torch.randn(1, 4, 32, dtype=DTYPE)
    cos, sin = _rope()(torch.arange(4), DTYPE)
    w_q, w_k, w_v = attn.qkv_proj.weight.split([32, 16, 16])  # stacked q/k/v rows (checkpoint order)
    q = (x @ w_q.T).view(1, 4, 4, 8).transpose(1, 2)
    k = (x @ w_k.T).view(1, 4, 2, 8).transpose(1, 2)
    v = (x @ w_v.T).view(1, 4, 2, 8).transpose(1, 2)

    def rot(t: torch.Tensor) -> torch.Tensor:
        return t * cos + torch.cat((-t[..., 4:], t[..., :4]), -1) * sin

    q, k = rot(q), rot(k)
    heads = []
    for h in range(4):
        kv = h // 2  # query heads 0,1 -> kv head 0; 2,3 -> kv head 1
        scores = q[0, h] @ k[0, kv].T / math.sqrt(8)
        scores = scores.masked_fill(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), float("-inf"))
        heads.append(scores.softmax(-1) @ v[0, kv])
    expected = attn.o_proj(torch.stack(heads, 0).transpose(0, 1).reshape(1, 4, 32))
    torch.testing.assert_close(attn(x, cos, sin, contiguous_step(0, 4, [None], "cpu")), expected, rtol=0, atol=1e-12)


def test_gqa_without_a_mask_lets_every_query_see_every_key() -> None:
    """mask None over T > 1 queries and G = 2 heads per KV head: each head's softmax(q k^T * scale) v
    over all keys, written out per head (query head h reads KV head h // 2)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 3, 8, generator=g, dtype=DTYPE)  # [B, H, T, D]
    k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=DTYPE) for _ in range(2))  # [B, Hkv, S, D]
    expected = torch.stack([((q[0, h] @ k[0, h // 2].T) * 0.5).softmax(-1) @ v[0, h // 2] for h in range(4)])[None]
    torch.testing.assert_close(grouped_query_attention(q, k, v, None, 0.5), expected, rtol=0, atol=1e-12)


def test_head_transform_norms_each_of_q_and_k_that_has_a_norm() -> None:
    """Each norm given applies to its own projection only, before RoPE (zero angles: RoPE is the identity)."""
    q, k = torch.ones(1, 2, 3, 4, dtype=DTYPE), torch.ones(1, 1, 3, 4, dtype=DTYPE)
    cos, sin = torch.ones(3, 4, dtype=DTYPE), torch.zeros(3, 4, dtype=DTYPE)
    for q_norm, k_norm, q_out, k_out in ((lambda t: 2 * t, None, 2.0, 1.0), (None, lambda t: 3 * t, 1.0, 3.0), (lambda t: 2 * t, lambda t: 3 * t, 2.0, 3.0)):
        q_got, k_got = HeadTransform(cos, sin, q_norm, k_norm).apply(q, k)
        assert torch.equal(q_got, q_out * q) and torch.equal(k_got, k_out * k)


# -- masks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("q_len", [1, 2, 5])
@pytest.mark.parametrize("start", [0, 1, 7])
@pytest.mark.parametrize("window", [None, 1, 3, 8])
def test_mask_is_the_visibility_rule(q_len: int, start: int, window: int | None) -> None:
    mask = attention_mask(q_len, start, window, "cpu")
    for i in range(q_len):
        pos = start + i
        for j in range(start + q_len):
            visible = j <= pos and (window is None or pos - window < j)
            got = True if mask is None else bool(mask[i, j])
            assert got == visible, (i, j, pos, window)


def test_mask_is_bottom_right_aligned_over_a_cache() -> None:
    # 2 new queries after 3 cached keys: query 0 is at position 3 and sees keys 0..3, not 0..0.
    mask = attention_mask(2, 3, None, "cpu")
    assert mask is not None
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_decode_mask_is_none_only_when_nothing_is_hidden() -> None:
    assert attention_mask(1, 9, None, "cpu") is None
    assert attention_mask(1, 3, 4, "cpu") is None  # 4 keys, window 4: all visible
    decode = attention_mask(1, 4, 4, "cpu")  # 5 keys, window 4: key 0 is out
    assert decode is not None and decode.tolist() == [[False, True, True, True, True]]


def test_masks_are_built_on_the_device_of_their_queries() -> None:
    """A mask made on another device than its attention's would fail there (or copy each step); the
    meta device shows where a tensor was made without needing one."""
    mask = attention_mask(2, 3, None, "meta")
    assert mask is not None and mask.device.type == "meta" and mask.shape == (2, 5)
    batched = visible_keys(torch.arange(6, device="meta").view(2, 3), 4, 2)  # [B=2, T=3] positions
    assert batched.device.type == "meta" and batched.shape == (2, 3, 4)


# -- RoPE ------------------------------------------------------------------------------------------


def test_rope_table_is_float64_math_rounded_from_fp32() -> None:
    rope = _rope(8)
    cos, sin = rope(torch.arange(50, 53), torch.float64)
    inv = [1 / 10_000 ** (i / 8) for i in range(0, 8, 2)]
    for row, pos in enumerate(range(50, 53)):
        angles = [pos * f for f in inv] * 2
        torch.testing.assert_close(cos[row], torch.tensor([math.cos(a) for a in angles], dtype=DTYPE), atol=1e-5, rtol=0)
        torch.testing.assert_close(sin[row], torch.tensor([math.sin(a) for a in angles], dtype=DTYPE), atol=1e-5, rtol=0)


def test_llama3_scaling_bands() -> None:
    rope = RopeConfig(theta=10_000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=32)
    plain = rope_inv_freq(16, RopeConfig(theta=10_000.0)).double()
    scaled = rope_inv_freq(16, rope).double()
    for f, s in zip(plain.tolist(), scaled.tolist(), strict=True):
        wavelen = 2 * math.pi / f
        if wavelen < 32 / 4:  # high frequency: untouched
            assert s == pytest.approx(f, rel=1e-6)
        elif wavelen > 32 / 1:  # low frequency: divided by factor
            assert s == pytest.approx(f / 8, rel=1e-6)
        else:  # smooth interpolation between f/8 and f
            smooth = (32 / wavelen - 1) / (4 - 1)
            assert s == pytest.approx((1 - smooth) * f / 8 + smooth * f, rel=1e-6)
    assert (scaled != plain).any() and (scaled == plain).any()


def test_linear_scaling_divides_by_factor() -> None:
    plain = rope_inv_freq(16, RopeConfig(theta=1e6))
    linear = rope_inv_freq(16, RopeConfig(theta=1e6, rope_type="linear", factor=8.0))
    torch.testing.assert_close(linear, plain / 8)


# -- norms ----------------------------------------------------------------------------------------


def test_rmsnorm_formula() -> None:
    norm = RMSNorm(4, 1e-5)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5, -1.0])
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    rms = math.sqrt((1 + 4 + 9 + 16) / 4 + 1e-5)
    torch.testing.assert_close(norm(x), torch.tensor([[1 / rms, 4 / rms, 1.5 / rms, -4 / rms]]))


def test_gemma_rmsnorm_uses_one_plus_weight() -> None:
    norm = GemmaRMSNorm(2, 1e-6)
    norm.weight.data = torch.tensor([0.0, 1.0])
    x = torch.tensor([[3.0, 4.0]])
    rms = math.sqrt((9 + 16) / 2 + 1e-6)
    torch.testing.assert_close(norm(x), torch.tensor([[3 / rms, 2 * 4 / rms]]))


@pytest.mark.parametrize("per_row", [False, True], ids=["shared-table", "per-row-table"])
def test_rotating_q_and_k_together_equals_rotating_each(per_row: bool) -> None:
    """apply_rope_to_pair is apply_rope of q and of k, bit for bit (bf16: every rounding the same)."""
    g = torch.Generator().manual_seed(3)
    b, h, hkv, t, d = 2, 4, 2, 3, 8
    q = torch.randn(b, h, t, d, generator=g).to(torch.bfloat16)
    k = torch.randn(b, hkv, t, d, generator=g).to(torch.bfloat16)
    shape = (b, t, d) if per_row else (t, d)
    angles = torch.randn(shape, generator=g)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    q_pair, k_pair = apply_rope_to_pair(q, k, cos, sin)
    assert torch.equal(q_pair, apply_rope(q, cos, sin))
    assert torch.equal(k_pair, apply_rope(k, cos, sin))
