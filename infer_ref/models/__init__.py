"""Decoder families, looked up by ``model_type``."""

from __future__ import annotations

from collections.abc import Callable

from infer_ref.config import ConfigError, ModelConfig
from infer_ref.models.common import DecoderLM
from infer_ref.models.gemma3 import Gemma3Model
from infer_ref.models.llama import LlamaModel
from infer_ref.models.qwen3 import Qwen3Model

MODEL_CLASSES: dict[str, Callable[[ModelConfig], DecoderLM]] = {
    "llama": LlamaModel,
    "qwen3": Qwen3Model,
    "gemma3_text": Gemma3Model,
}


def model_class(config: ModelConfig) -> Callable[[ModelConfig], DecoderLM]:
    try:
        return MODEL_CLASSES[config.model_type]
    except KeyError:
        raise ConfigError(
            f"no model class for model_type {config.model_type!r}; supported: {', '.join(MODEL_CLASSES)}"
        ) from None


def build_model(config: ModelConfig) -> DecoderLM:
    """A randomly initialised model for ``config`` (weights as nn.Module's default init)."""
    return model_class(config)(config)


__all__ = ["MODEL_CLASSES", "DecoderLM", "Gemma3Model", "LlamaModel", "Qwen3Model", "build_model", "model_class"]
