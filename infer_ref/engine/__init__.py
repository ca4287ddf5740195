"""Generation engine: sampling, the runner, and the one- and many-request loops. Models know nothing of it."""

from infer_ref.engine.generate import InferModel, generate
from infer_ref.engine.result import GenerationResult, GenerationTiming
from infer_ref.engine.sampling import SamplingParams, sample_token

__all__ = ["GenerationResult", "GenerationTiming", "InferModel", "SamplingParams", "generate", "sample_token"]
