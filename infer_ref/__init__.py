"""infer_ref: an exact, readable reference for KV-cached Llama 3.2, Qwen3 and Gemma 3 inference,
and the conformance suite around it."""

from infer_ref.cache import KVCache, KVCacheOverflowError
from infer_ref.config import ConfigError, ModelConfig
from infer_ref.engine import GenerationResult, SamplingParams, generate, sample_token
from infer_ref.loader import CheckpointError, load_model

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "GenerationResult",
    "KVCache",
    "KVCacheOverflowError",
    "ModelConfig",
    "SamplingParams",
    "Tokenizer",
    "generate",
    "load_model",
    "render_chat_template",
    "sample_token",
]


def __getattr__(name: str) -> object:
    # Tokenizer and chat templates import the `tokenizers` package; load them on first use.
    if name == "Tokenizer":
        from infer_ref.tokenizer import Tokenizer

        return Tokenizer
    if name == "render_chat_template":
        from infer_ref.chat import render_chat_template

        return render_chat_template
    raise AttributeError(f"module 'infer_ref' has no attribute {name!r}")
