"""infer_ref: an exact, readable reference for KV-cached Llama 3.2, Qwen3 and Gemma 3 inference,
and the conformance suite around it."""

from infer_ref._moved_modules import install as _install_moved_modules
from infer_ref.cache import KVCache, KVCacheOverflowError
from infer_ref.chat import render_chat_template
from infer_ref.config import ConfigError, ModelConfig
from infer_ref.engine import GenerationResult, SamplingParams, generate, sample_token
from infer_ref.engine.engine import Engine
from infer_ref.errors import DataError, InferRefError, NonFiniteError, UsageError
from infer_ref.loader import CheckpointError, load_model
from infer_ref.tokenizer import Tokenizer

__version__ = "0.1.0"

_install_moved_modules()  # old import paths (the kit, the kernels, the fast decoder, ...), for one release

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
