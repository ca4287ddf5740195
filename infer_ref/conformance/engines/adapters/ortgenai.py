"""ONNX Runtime GenAI (``onnxruntime_genai``) as an engine of the tier, in its own venv.

``start_ortgenai(model_dir, options)`` is an :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
it builds ``model_dir`` with the engine's own model builder (``ortgenai_build``: cached, the dtype
as its ``--precision``, CPU), then runs ``engines/workers/ortgenai_worker.py`` under ``python=``,
else ``$INFER_REF_ORTGENAI_PYTHON``, else the current interpreter, through the bridge.
``scripts/install_ortgenai.sh`` builds such a venv.
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    named_when_missing,
    start_bridged,
    worker_env,
)
from infer_ref.conformance.engines.adapters.ortgenai_build import Built, build
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record
from infer_ref.conformance.interface.contract import Unsupported

ENGINE = record("onnxruntime-genai")
PYTHON_ENV = ENGINE.python_env


# The tier runs the builder's CPU target; measured with onnxruntime-genai 0.18.0 (onnxruntime 1.32.0)
# on llama-tiny, what a low-precision build does there (docs/engines.md, "bfloat16 and float16 on the CPU").
CPU_LOW_PRECISION_REFUSED = {
    "float16": (
        "ONNX Runtime's CPU execution provider has no float16 kernels for this graph: it inserts casts to "
        "float32 around them (InsertedPrecisionFreeCast nodes), so the model would not compute in float16, "
        "and that build fails at its first generate (a shape mismatch re-using a cast's buffer)"
    ),
    "bfloat16": (
        "ONNX Runtime's CPU execution provider cannot run the builder's bfloat16 model: the session does "
        "not start (no bfloat16 kernel for the attention mask's Where(16) node)"
    ),
}


def start_ortgenai(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    start_timeout: float = 300.0,
    request_timeout: float = 300.0,
) -> BridgedEngine:
    """Build ``model_dir`` with ONNX Runtime GenAI's model builder and open it in ``og.Model`` in a worker."""
    check_model_dir(model_dir)
    if options.dtype in CPU_LOW_PRECISION_REFUSED:
        raise Unsupported(CPU_LOW_PRECISION_REFUSED[options.dtype])
    interpreter = engine_interpreter(ENGINE, python)
    with named_when_missing(ENGINE, interpreter):
        built = build(Path(model_dir), options.dtype, python=interpreter, env=worker_env(), cache=cache)
    engine = start_bridged(
        OrtGenAIEngine,
        ENGINE,
        interpreter,
        model_dir,
        options,
        start_timeout=start_timeout,
        request_timeout=request_timeout,
        extra={"onnx_dir": os.fspath(built.path)},
    )
    engine.built = built
    return engine


class OrtGenAIEngine(BridgedEngine):
    """ONNX Runtime GenAI behind the bridge; a failure's repro script opens the same built folder."""

    built: Built | None = None

    def repro_snippet(self) -> str:
        return _REPRO.format(onnx_dir=os.fspath(self.built.path) if self.built else "")


_REPRO = """# needs: onnxruntime-genai (in its own venv), numpy
import numpy as np
import onnxruntime_genai as og

ONNX_DIR = {onnx_dir!r}  # MODEL_DIR built by python -m onnxruntime_genai.models.builder -e cpu


def start_engine():
    return og.Model(ONNX_DIR)


def position(token, logits, k):
    logprobs = logits.astype(np.float64) - logits.max()
    logprobs -= np.log(np.exp(logprobs).sum())
    return [int(token), float(logprobs[token]), [[int(t), float(logprobs[t])] for t in np.argsort(-logprobs, kind="stable")[:k]]]


def run(model, requests):
    answers = []
    for r in requests:  # one generator per request, greedy unless sampled
        params = og.GeneratorParams(model)
        search = dict(max_length=len(r["prompt"]) + r["max_tokens"], do_sample=r["temperature"] > 0)
        if search["do_sample"]:
            search.update(temperature=r["temperature"], top_p=r["top_p"], top_k=r["top_k"] or 10**9)
            if r["seed"] is not None:
                search["random_seed"] = r["seed"]
        params.set_search_options(**search)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array(r["prompt"], dtype=np.int32))
        tokens, steps = [], []
        while len(tokens) < r["max_tokens"] and not generator.is_done():
            row = np.array(generator.get_logits())[0, -1]
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            steps.append(position(tokens[-1], row, r["logprobs"]))
        answers.append({{"token_ids": tokens, "steps": steps}})
    return answers
"""


# Everything the tier can ask of ONNX Runtime GenAI (the worker reports the same after a start).
start_ortgenai.capabilities = frozenset(  # type: ignore[attr-defined]
    {"prompt_logprobs", "seed", "top_k_top_p", "top_logprobs", "chunked_prefill"}
)
