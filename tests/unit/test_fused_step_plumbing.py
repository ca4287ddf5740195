"""The fused decode step's plumbing, on the CPU: what the model hands the kernels is what it computes.

In a captured decode step the model's projections take their input norm, residual add and output
norm as kernel arguments (``Normed`` inputs, ``residual=``, ``out_norm=``: the norms' ``spec``), and
a static cache's one-token step takes q and k before the head transform (``attend_projected``).
Off CUDA every one of those calls runs the kernels' torch references, so switching the decode
kernels on must leave the logits and the cache contents bit for bit what the eager modules give:
a wrong norm handed to a projection, a residual added twice or not at all, a transform applied
twice or skipped would each show here without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from infer_ref.attention import HeadTransform
from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.protocol import cached_attention
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, tiny_config
from infer_ref.kernels.rotary import apply_rope
from infer_ref.kernels.switch import decode_kernels
from infer_ref.models import build_model
from infer_ref.models.common import RMSNorm

PROMPT, STEPS = 6, 12  # the tiny configs' windows are shorter than PROMPT + STEPS: the decode steps cross them


def _model(family: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    config = ModelConfig.from_hf_dict(tiny_config(family))
    torch.manual_seed(7)
    model = build_model(config).eval()
    model.reset_buffers("cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # norms' weights away from their initial 1 or 0: a wrong norm shows
    return model.to(dtype), config


def _cache(kind: str, config: ModelConfig, dtype: torch.dtype) -> StaticKVCache | StaticPagedKVCache:
    if kind == "static":
        return StaticKVCache.from_model_config(config, 32, dtype=dtype, device="cpu")
    return StaticPagedKVCache.from_model_config(config, 32, block_size=4, dtype=dtype, device="cpu")


def _decode(model, cache, ids: Tensor, kernels: bool) -> Tensor:  # type: ignore[no-untyped-def]
    with torch.inference_mode(), decode_kernels(kernels):
        logits = [model(ids[:, :PROMPT], kv_cache=cache)]
        logits += [model(ids[:, i : i + 1], kv_cache=cache) for i in range(PROMPT, PROMPT + STEPS)]
    return torch.cat(logits, dim=1)  # [1, 1 + STEPS, V]


@pytest.mark.parametrize("kind", ["static", "static-paged"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bf16", "fp64"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_kernels_on_equal_the_eager_modules_bit_for_bit(family: str, dtype: torch.dtype, kind: str) -> None:
    model, config = _model(family, dtype)
    ids = torch.randint(0, config.vocab_size, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    eager_cache, kernel_cache = _cache(kind, config, dtype), _cache(kind, config, dtype)
    eager = _decode(model, eager_cache, ids, kernels=False)
    fused = _decode(model, kernel_cache, ids, kernels=True)
    assert torch.isfinite(eager).all()
    assert torch.equal(fused, eager), f"max |diff| {(fused.double() - eager.double()).abs().max().item():.3g}"
    for layer in range(config.num_hidden_layers):
        for got, want in zip(kernel_cache.get_kv(layer), eager_cache.get_kv(layer), strict=True):
            assert torch.equal(got, want), f"layer {layer}: the cache holds other K/V with the decode kernels on"


def test_the_control_differs_when_a_projection_gets_the_wrong_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: hand every normed projection the block's other norm and it does."""
    model, config = _model("llama", torch.float64)
    ids = torch.randint(0, config.vocab_size, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    eager = _decode(model, _cache("static", config, torch.float64), ids, kernels=False)
    block = model.layers[0]
    monkeypatch.setattr(block.input_layernorm, "weight", block.post_attention_layernorm.weight)
    swapped = _decode(model, _cache("static", config, torch.float64), ids, kernels=True)
    assert not torch.equal(swapped, eager)


class _Recorder(KVCache):
    """A contiguous cache that records the q/k its ``attend`` or ``attend_projected`` receives."""

    seen: list[tuple[str, Tensor, Tensor]]

    def attend(self, layer_idx, q, k, v, mask, scale):  # type: ignore[no-untyped-def]
        self.seen.append(("attend", q, k))
        keys, values = self.update(layer_idx, k, v)
        from infer_ref.attention import grouped_query_attention

        return grouped_query_attention(q, keys, values, mask, scale)


def _qkv_and_transform(with_norms: bool) -> tuple[Tensor, Tensor, Tensor, HeadTransform]:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 1, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    angles = torch.rand(1, 4, generator=g, dtype=torch.float64) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()  # [T=1, D]
    norms = (RMSNorm(8, 1e-6).double(), RMSNorm(8, 1e-6).double()) if with_norms else (None, None)
    for n in norms:
        if n is not None:
            torch.nn.init.normal_(n.weight, 1.0, 0.3, generator=g)
    return q, k, v, HeadTransform(cos, sin, *norms)


@pytest.mark.parametrize("with_norms", [False, True])
def test_cached_attention_applies_the_transform_once_for_caches_without_attend_projected(with_norms: bool) -> None:
    q, k, v, transform = _qkv_and_transform(with_norms)
    cache = _Recorder.allocate(1, 2, 8, 4, batch_size=1, dtype=torch.float64, device="cpu")
    cache.seen = []
    cached_attention(cache, 0, q, k, v, None, 0.5, transform)
    (kind, got_q, got_k), = cache.seen
    want_q, want_k = q, k
    if with_norms:
        assert transform.q_norm is not None and transform.k_norm is not None
        want_q, want_k = transform.q_norm(q), transform.k_norm(k)
    assert kind == "attend"
    assert torch.equal(got_q, apply_rope(want_q, transform.cos, transform.sin))
    assert torch.equal(got_k, apply_rope(want_k, transform.cos, transform.sin))


def test_cached_attention_hands_attend_projected_the_untransformed_q_and_k() -> None:
    q, k, v, transform = _qkv_and_transform(True)
    received: dict[str, object] = {}

    class Fused(KVCache):
        def attend_projected(self, layer_idx, q, k, v, transform, mask, scale):  # type: ignore[no-untyped-def]
            received.update(q=q, k=k, transform=transform)
            return q

    cache = Fused.allocate(1, 2, 8, 4, batch_size=1, dtype=torch.float64, device="cpu")
    cached_attention(cache, 0, q, k, v, None, 0.5, transform)
    assert received["q"] is q and received["k"] is k and received["transform"] is transform
