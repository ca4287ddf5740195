"""Qwen3 decoder: the Llama block plus per-head RMSNorm on Q and K, applied before RoPE."""

from __future__ import annotations

from torch import nn

from infer_ref.config import ModelConfig
from infer_ref.models.common import DecoderLM, RMSNorm
from infer_ref.models.llama import PreNormBlock


class Qwen3Model(DecoderLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, norm=RMSNorm)
        self.layers = nn.ModuleList(PreNormBlock(config, qk_norm=RMSNorm) for _ in range(config.num_hidden_layers))
