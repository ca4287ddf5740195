"""Llama 3.x decoder (Llama-3.2-1B: 16 layers, 32 heads, 8 KV heads, head_dim 64, llama3 RoPE scaling)."""

from __future__ import annotations

from torch import Tensor, nn

from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.config import ModelConfig
from infer_ref.models.common import MLP, Attention, DecoderLM, Normed, NormFactory, RMSNorm
from infer_ref.step import Step


class PreNormBlock(nn.Module):
    """``x + attn(norm(x))`` then ``x + mlp(norm(x))``: the Llama/Qwen block.

    Each sub-layer takes its input as ``Normed(norm, x)`` and the residual stream ``x`` to add its
    output to: the projections compute both (in a captured decode step, inside their kernels).
    """

    def __init__(self, config: ModelConfig, qk_norm: NormFactory | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        step: Step,
        kv_cache: KVCacheProtocol | None = None,
        layer_idx: int = 0,
    ) -> Tensor:
        x = self.self_attn(Normed(self.input_layernorm, x), cos, sin, step, kv_cache, layer_idx, residual=x)  # [B, T, E]
        return self.mlp(Normed(self.post_attention_layernorm, x), residual=x)


class LlamaModel(DecoderLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, norm=RMSNorm)
        self.layers = nn.ModuleList(PreNormBlock(config, qk_norm=None) for _ in range(config.num_hidden_layers))
