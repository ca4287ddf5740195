"""CTranslate2 (``ctranslate2.Generator``) as an engine of the tier, in its own venv.

``start_ct2(model_dir, options)`` is an :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
it converts ``model_dir`` with CTranslate2's own converter (``ct2_convert``: cached, the dtype as
its ``--quantization``), then runs ``engines/workers/ct2_worker.py`` under ``python=``, else
``$INFER_REF_CT2_PYTHON``, else the current interpreter, through the bridge.
``scripts/install_ct2.sh`` builds such a venv.

What the Generator lacks is declared, not faked: no prefix cache reused across calls (a
``static_prompt`` must be named by the caller), no chunked prefill, no KV budget, no stop strings
(end tokens only); generation settings and the random seed are per call, so requests that differ
in them go out as separate calls.
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_ref.conformance.engines.adapters.ct2_convert import Converted, convert, ctranslate2_version
from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    missing_engine,
    start_bridged,
    worker_env,
)
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record

ENGINE = record("ctranslate2")
PYTHON_ENV = ENGINE.python_env


def convert_for_ct2(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> tuple[str, Converted]:
    """The engine's interpreter and ``model_dir`` converted (cached) at ``options.dtype``."""
    check_model_dir(model_dir)
    interpreter = engine_interpreter(ENGINE, python)
    env = worker_env()
    version = ctranslate2_version(interpreter, env, missing_engine(ENGINE, interpreter))
    return interpreter, convert(
        Path(model_dir), options.dtype, python=interpreter, version=version, env=env, cache=cache
    )


def start_ct2(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    threads: int = 1,
    start_timeout: float = 300.0,
    request_timeout: float = 300.0,
) -> BridgedEngine:
    """Convert ``model_dir`` with CTranslate2's converter and open it in ``ctranslate2.Generator`` in a
    worker."""
    interpreter, converted = convert_for_ct2(model_dir, options, python=python, cache=cache)
    extra = {
        "converted": os.fspath(converted.path),
        "compute_type": converted.quantization,
        "threads": threads,
    }
    engine = start_bridged(
        Ct2Engine,
        ENGINE,
        interpreter,
        model_dir,
        options,
        start_timeout=start_timeout,
        request_timeout=request_timeout,
        extra=extra,
    )
    engine.converted = converted
    return engine


class Ct2Engine(BridgedEngine):
    """CTranslate2 behind the bridge; a failure's repro script opens the same converted directory."""

    converted: Converted | None = None

    def repro_snippet(self) -> str:
        kwargs = dict(self.start_result.get("generator_kwargs", {}))
        converted = os.fspath(self.converted.path) if self.converted else ""
        return _REPRO.format(converted=converted, kwargs=kwargs)


_REPRO = """# needs: ctranslate2 (in its own venv), numpy
import json
import os

import numpy as np
import ctranslate2

CONVERTED = {converted!r}  # MODEL_DIR converted by ct2-transformers-converter
GENERATOR_KWARGS = {kwargs!r}


def start_engine():
    return ctranslate2.Generator(CONVERTED, **GENERATOR_KWARGS)


def position(token, logits, k):
    logprobs = np.asarray(logits, dtype=np.float64) - np.max(logits)
    logprobs -= np.log(np.exp(logprobs).sum())
    return [int(token), float(logprobs[token]), [[int(t), float(logprobs[t])] for t in np.argsort(-logprobs, kind="stable")[:k]]]


def run(generator, requests):
    with open(os.path.join(CONVERTED, "vocabulary.json"), encoding="utf-8") as f:
        vocabulary = json.load(f)  # generate_batch takes token strings
    r = requests[0]  # a group shares its settings (the tier sends greedy groups)
    results = generator.generate_batch([[vocabulary[t] for t in q["prompt"]] for q in requests],
                                       max_length=r["max_tokens"], include_prompt_in_result=False,
                                       return_logits_vocab=True, return_end_token=True, sampling_topk=1,
                                       end_token=[] if r["ignore_eos"] else None)
    answers = []
    for q, result in zip(requests, results):
        tokens = list(result.sequences_ids[0])
        steps = [position(t, np.array(row), q["logprobs"]) for t, row in zip(tokens, result.logits[0])]
        answers.append({{"token_ids": tokens, "steps": steps}})
    return answers
"""

# Everything the tier can ask of CTranslate2's Generator (the worker reports the same after a start).
start_ct2.capabilities = frozenset(  # type: ignore[attr-defined]
    {"prompt_logprobs", "seed", "batch", "top_k_top_p", "ignore_eos", "top_logprobs"}
)
