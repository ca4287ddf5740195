"""infer_ref: an exact, readable reference for KV-cached Llama 3.2, Qwen3 and Gemma 3 inference,
and the conformance suite around it.

The public names below are imported on first use (``infer_ref._lazy``): ``import infer_ref`` alone
does not import torch, so the command line answers ``--help`` and usage errors at once.
"""

from typing import TYPE_CHECKING

from infer_ref._lazy import lazy_exports

if TYPE_CHECKING:
    from infer_ref.cache import KVCache, KVCacheOverflowError
    from infer_ref.chat import render_chat_template
    from infer_ref.config import ConfigError, ModelConfig
    from infer_ref.engine import GenerationResult, SamplingParams, generate, sample_token
    from infer_ref.engine.engine import Engine
    from infer_ref.errors import DataError, InferRefError, NonFiniteError, UsageError
    from infer_ref.loader import CheckpointError, load_model
    from infer_ref.tokenizer import Tokenizer

__version__ = "0.1.0"

_HOMES = {
    "KVCache": "infer_ref.cache", "KVCacheOverflowError": "infer_ref.cache",
    "render_chat_template": "infer_ref.chat",
    "ConfigError": "infer_ref.config", "ModelConfig": "infer_ref.config",
    "GenerationResult": "infer_ref.engine", "SamplingParams": "infer_ref.engine", "generate": "infer_ref.engine",
    "sample_token": "infer_ref.engine",
    "Engine": "infer_ref.engine.engine",
    "DataError": "infer_ref.errors", "InferRefError": "infer_ref.errors", "NonFiniteError": "infer_ref.errors",
    "UsageError": "infer_ref.errors",
    "CheckpointError": "infer_ref.loader", "load_model": "infer_ref.loader",
    "Tokenizer": "infer_ref.tokenizer",
}  # fmt: skip
__getattr__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "Engine",
    "GenerationResult",
    "InferRefError",
    "KVCache",
    "KVCacheOverflowError",
    "ModelConfig",
    "NonFiniteError",
    "SamplingParams",
    "Tokenizer",
    "UsageError",
    "generate",
    "load_model",
    "render_chat_template",
    "sample_token",
]
