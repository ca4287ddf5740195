"""The names the ``golden`` commands take, without torch: so that ``--synthetic gpt-9`` or
``--plant-bug nope`` is refused before torch is imported (the golden package imports it).

The tables they name stay where their contents are made, keyed by these names:
``golden_models.SYNTHETIC_MODELS`` (the synthetic weights), ``golden.planted`` (the planted bugs),
``golden.implementations`` (the built-in implementations).
"""

from __future__ import annotations

__all__ = ["IMPLEMENTATIONS", "PLANTED_BUGS", "REAL_SHAPE_MODELS", "STANDIN_MODELS", "SYNTHETIC_MODEL_NAMES"]

# Synthetic models of the released models' shapes (snapshots.REAL_SHAPE_CONFIGS) ...
REAL_SHAPE_MODELS = ("llama-3.2-1b", "qwen3-1.7b", "gemma-3-1b-it")
# ... and small stand-ins of the same structure, for dry runs of the GPU flow on CPU: name -> model_type.
STANDIN_MODELS = {"llama-standin": "llama", "qwen3-standin": "qwen3", "gemma3-standin": "gemma3_text"}
SYNTHETIC_MODEL_NAMES = (*REAL_SHAPE_MODELS, *STANDIN_MODELS)

IMPLEMENTATIONS = ("infer_ref", "transformers", "transformers-uncached")
"""Built-in implementations; any conformance adapter is also accepted as ``module:OBJECT``."""

PLANTED_BUGS: dict[str, str] = {
    "sliding-window-decode-mask": "infer_ref.conformance.mutants:decode_window_missing",
}
"""Known bugs that can be planted into infer_ref: name -> the mutant adapter (``module:OBJECT``) carrying it."""
