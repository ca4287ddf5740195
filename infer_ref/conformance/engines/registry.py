"""The engines the tier knows by name, without importing any of them (the command line checks
``--engine`` against these before pytest starts): name -> ``module:factory``."""

from __future__ import annotations

ENGINES = {
    "infer_ref": "infer_ref.conformance.engines.adapters.infer_ref_engine:start_infer_ref",
    "transformers": "infer_ref.conformance.engines.adapters.transformers_generate:start_transformers",
    "transformers-cb": "infer_ref.conformance.engines.adapters.transformers_batch:start_transformers_batch",
    "vllm": "infer_ref.conformance.engines.adapters.vllm:start_vllm",
    "vllm-server": "infer_ref.conformance.engines.adapters.vllm_server:start_vllm_server",
    "llama.cpp": "infer_ref.conformance.engines.adapters.llamacpp:start_llamacpp",
    "llama.cpp-server": "infer_ref.conformance.engines.adapters.llamacpp_server:start_llamacpp_server",
    "ctranslate2": "infer_ref.conformance.engines.adapters.ct2:start_ct2",
    "onnxruntime-genai": "infer_ref.conformance.engines.adapters.ortgenai:start_ortgenai",
    "openvino": "infer_ref.conformance.engines.adapters.openvino:start_openvino",
}


def known_engine(spec: str) -> bool:
    """A name of :data:`ENGINES`, or a user's ``module:FACTORY``."""
    return spec in ENGINES or ":" in spec
