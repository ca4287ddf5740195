"""The runtime: the runner, the scheduler and the one- and many-request loops. Models know nothing of it.

Sampling (``infer_ref.sampling``) and a request's result (``infer_ref.results``) sit below it, shared
with the fast path's captured decoder; they are re-exported here.
"""

from infer_ref.engine.generate import InferModel, generate
from infer_ref.results import GenerationResult, GenerationTiming
from infer_ref.sampling import SamplingParams, sample_token

__all__ = ["GenerationResult", "GenerationTiming", "InferModel", "SamplingParams", "generate", "sample_token"]
