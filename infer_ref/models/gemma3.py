"""Gemma 3 text decoder.

Differences from Llama: embeddings scaled by ``sqrt(hidden)`` rounded to the weight dtype; Gemma
RMSNorm (``1 + w``, all fp32) with four norms per block; QK-norm before RoPE; attention scale
``query_pre_attn_scalar ** -0.5``; gelu-tanh MLP; sliding-window layers with their own RoPE base
(1e4) interleaved with global layers (1e6).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.config import ModelConfig
from infer_ref.models.common import MLP, Attention, DecoderLM, GemmaRMSNorm, Normed
from infer_ref.step import Step


class SandwichBlock(nn.Module):
    """Gemma 3 block: each sub-layer is normed on the way in and on the way out, then added to ``x``.

    ``x + post_norm(sublayer(pre_norm(x)))``: the input as ``Normed(pre_norm, x)``, the output norm
    and the residual handed to the sub-layer, whose last projection applies them.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(e, eps)
        self.self_attn = Attention(config, qk_norm=GemmaRMSNorm)
        self.post_attention_layernorm = GemmaRMSNorm(e, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(e, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(e, eps)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        step: Step,
        kv_cache: KVCacheProtocol | None = None,
        layer_idx: int = 0,
    ) -> Tensor:
        x = self.self_attn(
            Normed(self.input_layernorm, x), cos, sin, step, kv_cache, layer_idx,
            residual=x, out_norm=self.post_attention_layernorm,
        )  # [B, T, E]
        return self.mlp(Normed(self.pre_feedforward_layernorm, x), residual=x, out_norm=self.post_feedforward_layernorm)


class Gemma3Model(DecoderLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, norm=GemmaRMSNorm)
        self.layers = nn.ModuleList(SandwichBlock(config) for _ in range(config.num_hidden_layers))

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embed_tokens(input_ids)  # [B, T, E]
        # sqrt(hidden) rounded to the activation dtype first: 33.94 becomes 34.0 in bf16.
        # torch.full, not torch.tensor: no host-to-device copy, so a CUDA graph can capture it.
        return x * torch.full((), self.config.hidden_size**0.5, dtype=x.dtype, device=x.device)
