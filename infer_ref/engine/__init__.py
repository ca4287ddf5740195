"""Generation engine: sampling and the prefill/decode loop. Models know nothing of it."""

from infer_ref.engine.generate import GenerationResult, GenerationTiming, InferModel, generate
from infer_ref.engine.sampling import SamplingParams, sample_token

__all__ = ["GenerationResult", "GenerationTiming", "InferModel", "SamplingParams", "generate", "sample_token"]
