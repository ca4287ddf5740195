"""OpenVINO GenAI (``ContinuousBatchingPipeline`` on the CPU) as an engine of the tier, in its own venv.

``start_openvino(model_dir, options)`` is an :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
it exports ``model_dir`` with optimum-intel's own exporter (``openvino_export``: cached,
``--weight-format fp32``), then runs ``engines/workers/openvino_worker.py`` under ``python=``, else
``$INFER_REF_OPENVINO_PYTHON``, else the current interpreter, through the bridge.
``scripts/install_openvino.sh`` builds such a venv (with the older transformers the Gemma 3 export
asks for on a path of its own).

The pipeline is OpenVINO's continuous-batching one, the scheduler that serves requests (prefix
caching, chunked prefill, a KV budget of blocks) for both of the tier's starts: the plain start is
the same pipeline with prefix caching off, whole-prompt steps and an ample cache. The CPU plugin's
inference and KV-cache precisions are set to f32 explicitly (its defaults depend on the processor).
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    missing_engine,
    start_bridged,
    worker_env,
)
from infer_ref.conformance.engines.adapters.openvino_export import Exported, export
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
    EngineNotInstalled,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record
from infer_ref.conformance.engines.workers.openvino_capabilities import CAPABILITIES
from infer_ref.conformance.interface.contract import Unsupported

ENGINE = record("openvino")
PYTHON_ENV = ENGINE.python_env
DTYPES = ("float32", "bfloat16")  # the worker's PRECISIONS: float16 is refused there, with the reason


def export_for_openvino(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    export_path: str | os.PathLike[str] | None = None,
) -> tuple[str, Exported]:
    """The engine's interpreter and ``model_dir`` exported (cached) by optimum-cli."""
    check_model_dir(model_dir)
    if options.dtype not in DTYPES:
        raise Unsupported(
            f"the OpenVINO adapter runs float32 and bfloat16 (asked {options.dtype}): OpenVINO's CPU plugin "
            "computes float16 only on processors with AVX512-FP16 or AMX-FP16"
        )
    interpreter = engine_interpreter(ENGINE, python)
    if not Path(interpreter).with_name("optimum-cli").is_file():
        raise EngineNotInstalled(
            missing_engine(ENGINE, interpreter)("no optimum-cli beside it (optimum-intel)")
        )
    return interpreter, export(
        Path(model_dir), python=interpreter, env=worker_env(), cache=cache, export_path=export_path
    )


def start_openvino(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    export_path: str | os.PathLike[str] | None = None,
    start_timeout: float = 300.0,
    request_timeout: float = 300.0,
) -> BridgedEngine:
    """Export ``model_dir`` with optimum-intel and serve it with ``ContinuousBatchingPipeline`` in a
    worker."""
    interpreter, exported = export_for_openvino(
        model_dir, options, python=python, cache=cache, export_path=export_path
    )
    engine = start_bridged(
        OpenVinoEngine,
        ENGINE,
        interpreter,
        model_dir,
        options,
        start_timeout=start_timeout,
        request_timeout=request_timeout,
        extra={"exported": os.fspath(exported.path)},
    )
    engine.exported = exported
    return engine


class OpenVinoEngine(BridgedEngine):
    """OpenVINO GenAI behind the bridge; a failure's repro script opens the same export with the same
    settings."""

    exported: Exported | None = None

    def repro_snippet(self) -> str:
        folder = os.fspath(self.exported.path) if self.exported else ""
        return _REPRO.format(
            folder=folder,
            scheduler=self.start_result.get("scheduler", {}),
            properties=self.start_result.get("properties", {}),
        )


_REPRO = """# needs: openvino-genai (in its own venv), numpy
import numpy as np
import openvino
import openvino_genai

EXPORTED = {folder!r}  # MODEL_DIR exported by optimum-cli export openvino --weight-format fp32
SCHEDULER = {scheduler!r}
PROPERTIES = {properties!r}


def start_engine():
    config = openvino_genai.SchedulerConfig()
    for name, value in SCHEDULER.items():
        setattr(config, name, value)
    return openvino_genai.ContinuousBatchingPipeline(EXPORTED, config, "CPU", PROPERTIES)


def run(pipe, requests):
    handles = []
    for i, r in enumerate(requests):
        config = openvino_genai.GenerationConfig()
        config.max_new_tokens, config.ignore_eos, config.logprobs = r["max_tokens"], r["ignore_eos"], 1
        handles.append(pipe.add_request(i, openvino.Tensor(np.array([r["prompt"]], dtype=np.int64)), config))
    while pipe.has_non_finished_requests():
        pipe.step()
    answers = []
    for handle in handles:
        out = handle.read_all()[0]
        # the chosen token's only
        steps = [[t, lp, []] for t, lp in zip(out.generated_ids, out.generated_log_probs)]
        answers.append({{"token_ids": list(out.generated_ids), "steps": steps}})
    return answers
"""


# Everything the tier can ask of OpenVINO GenAI: the worker's list (it reports the same after a start)
# and prefix caching, which a start turns on or off.
start_openvino.capabilities = frozenset({*CAPABILITIES, "prefix_caching"})  # type: ignore[attr-defined]
# Where OpenVINO's bfloat16 recipe differs from transformers' (names of recipes.LEGITIMATE): the model
# is exported in float32 (--weight-format fp32), so Gemma's sqrt(hidden) is a float32 constant of the
# graph, never rounded to bfloat16 as transformers rounds it. Measured on gemma3-numerics-hidden304
# (docs/low-precision.md, "Recipe errors"): its chosen-token error sits where the in-process recipe's does.
start_openvino.recipe_differences = {  # type: ignore[attr-defined]
    "embed_normaliser_float32": "Gemma's sqrt(hidden) a float32 constant of the float32 export"
}
