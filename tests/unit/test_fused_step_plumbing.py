"""The fused decode step's plumbing, on the CPU: what the model hands the kernels is what it computes.

In a captured decode step the model's projections take their input norm, residual add and output
norm as kernel arguments (``Normed`` inputs, ``residual=``, ``out_norm=``: the norms' ``spec``), and
the fast attention hands a static cache's one-token step q and k before the head transform (the
fused decode step applies it). Off CUDA every one of those calls runs the kernels' torch
references, so switching the decode kernels on in a model with the fast modules swapped in
(``use_fast_modules``) must leave the logits and the cache contents bit for bit what its eager
modules give:
a wrong norm handed to a projection, a residual added twice or not at all, a transform applied
twice or skipped would each show here without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from infer_ref.attention import HeadTransform
from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.protocol import plan_step
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, tiny_config
from infer_ref.fast import attention as fast_attention
from infer_ref.fast.modules import use_fast_modules
from infer_ref.fast.switch import decode_kernels
from infer_ref.models import build_model
from infer_ref.rotary import apply_rope

PROMPT, STEPS = 6, 12  # the tiny configs' windows are shorter than PROMPT + STEPS: the decode steps cross them


def _model(family: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    config = ModelConfig.from_hf_dict(tiny_config(family))
    torch.manual_seed(7)
    model = build_model(config).eval()
    model.reset_buffers("cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # norms' weights away from their initial 1 or 0: a wrong norm shows
    return use_fast_modules(model.to(dtype)), config


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
    """A contiguous cache that records the K its ``update`` receives."""

    written: list[Tensor]

    def update(self, layer_idx, k, v):  # type: ignore[no-untyped-def]
        self.written.append(k)
        return super().update(layer_idx, k, v)


def _qkv_and_transform(attn, with_norms: bool) -> tuple[Tensor, Tensor, Tensor, HeadTransform]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(3)
    d = attn.head_dim
    q, k, v = (torch.randn(1, h, 1, d, generator=g, dtype=torch.float64) for h in (attn.num_heads, attn.num_kv_heads, attn.num_kv_heads))
    angles = torch.rand(1, d // 2, generator=g, dtype=torch.float64) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()  # [T=1, D]
    norms = (attn.q_norm, attn.k_norm) if with_norms else (None, None)
    return q, k, v, HeadTransform(cos, sin, *norms)


@pytest.mark.parametrize("with_norms", [False, True])
def test_the_attention_applies_the_transform_once_for_caches_without_a_fused_step(with_norms: bool) -> None:
    model, config = _model("qwen3", torch.float64)
    attn = model.layers[0].self_attn
    q, k, v, transform = _qkv_and_transform(attn, with_norms)
    cache = _Recorder.allocate(config.num_hidden_layers, attn.num_kv_heads, attn.head_dim, 4, batch_size=1, dtype=torch.float64, device="cpu")
    cache.written = []
    attn.attend(q, k, v, transform, plan_step(cache, 1, model.layer_windows, torch.device("cpu")), cache, 0)
    (got_k,) = cache.written
    want_k = attn.k_norm(k) if with_norms else k
    assert torch.equal(got_k, apply_rope(want_k, transform.cos, transform.sin))


def test_the_fast_attention_hands_the_fused_step_the_untransformed_q_and_k(monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = _model("qwen3", torch.float64)
    attn = model.layers[0].self_attn
    q, k, v, transform = _qkv_and_transform(attn, True)
    received: dict[str, object] = {}

    def fused(q, k, v, k_all, v_all, layer, lengths, scale, window, transform):  # type: ignore[no-untyped-def]
        received.update(q=q, k=k, transform=transform, lengths=lengths)
        return q

    monkeypatch.setattr(fast_attention, "contiguous_decode_step", fused)
    cache = _cache("static", config, torch.float64)
    step = plan_step(cache, 1, model.layer_windows, torch.device("cpu"))
    attn.attend(q, k, v, transform, step, cache, 0)
    assert torch.equal(received["q"], q[:, :, 0]) and torch.equal(received["k"], k[:, :, 0])  # type: ignore[arg-type]
    assert received["transform"] is transform and received["lengths"] is step.lengths
