"""llama.cpp in-process (llama-cpp-python's ``Llama``) as an engine of the tier, in its own venv.

``start_llamacpp(model_dir, options)`` is an :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
it converts ``model_dir`` with llama.cpp's own converter (``llamacpp_gguf``: cached, the dtype as
its ``--outtype``), then runs ``engines/workers/llamacpp_worker.py`` under ``python=``, else
``$INFER_REF_LLAMACPP_PYTHON``, else the current interpreter, through the bridge.
``scripts/install_llamacpp.sh`` builds such a venv (and leaves the converter's tree in it).

The K/V cache holds the engine's dtype unless ``kv_cache_type`` says otherwise (llama.cpp's own
default is float16 whatever the weights: a float32 engine judged at float32 tolerance needs float32
K/V, and ``kv_cache_type="float16"`` judges that default apart).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    start_bridged,
    worker_env,
)
from infer_ref.conformance.engines.adapters.llamacpp_gguf import Converted, convert, llamacpp_source
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
)
from infer_ref.conformance.engines.protocol import DTYPES, EngineOptions
from infer_ref.conformance.engines.registry import record

ENGINE = record("llama.cpp")
PYTHON_ENV = ENGINE.python_env


def convert_for_llamacpp(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> tuple[str, Converted]:
    """The engine's interpreter and ``model_dir`` converted (cached) at ``options.dtype``."""
    check_model_dir(model_dir)
    interpreter = engine_interpreter(ENGINE, python)
    tree = llamacpp_source(source, interpreter)
    return interpreter, convert(
        Path(model_dir), options.dtype, python=interpreter, source=tree, env=worker_env(), cache=cache
    )


def start_llamacpp(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    kv_cache_type: str | None = None,
    threads: int = 1,
    start_timeout: float = 300.0,
    request_timeout: float = 300.0,
) -> BridgedEngine:
    """Convert ``model_dir`` with llama.cpp's converter and open it in ``llama_cpp.Llama`` in a worker."""
    check_kv_cache_type(kv_cache_type)
    interpreter, converted = convert_for_llamacpp(
        model_dir, options, python=python, source=source, cache=cache
    )
    extra: dict[str, Any] = {
        "gguf": os.fspath(converted.path),
        "kv_cache_type": kv_cache_type or options.dtype,
        "threads": threads,
    }
    engine = start_bridged(
        LlamaCppEngine,
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


def check_kv_cache_type(kv_cache_type: str | None) -> None:
    """A K/V cache type must name a dtype (``--engine-option kv_cache_type=float16``); llama.cpp
    itself refuses the ones it has no type for (float64)."""
    if kv_cache_type is not None and kv_cache_type not in DTYPES:
        raise ValueError(
            f"kv_cache_type {kv_cache_type!r}: expected one of {', '.join(DTYPES)} (None: the engine's dtype)"
        )


class LlamaCppEngine(BridgedEngine):
    """llama.cpp behind the bridge; a failure's repro script opens the same GGUF file with the same
    settings."""

    converted: Converted | None = None

    def repro_snippet(self) -> str:
        kwargs = dict(self.start_result.get("llama_kwargs", {}))
        gguf = os.fspath(self.converted.path) if self.converted else ""
        return _REPRO.format(gguf=gguf, kwargs=kwargs)


_REPRO = """# needs: llama-cpp-python (in its own venv), numpy
import numpy as np
import llama_cpp

GGUF = {gguf!r}  # MODEL_DIR converted by llama.cpp's convert_hf_to_gguf.py
LLAMA_KWARGS = {kwargs!r}


def start_engine():
    return llama_cpp.Llama(model_path=GGUF, **LLAMA_KWARGS)


def position(token, logits, k):
    logprobs = logits.astype(np.float64) - logits.max()
    logprobs -= np.log(np.exp(logprobs).sum())
    return [int(token), float(logprobs[token]), [[int(t), float(logprobs[t])] for t in np.argsort(-logprobs, kind="stable")[:k]]]


def run(llm, requests):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    answers = []
    for r in requests:  # one sequence at a time; the previous request's prefix is reused as the tier does
        if r["seed"] is not None:
            llm.set_seed(r["seed"])
        tokens, steps = [], []
        for token in llm.generate(r["prompt"], top_k=r["top_k"], top_p=r["top_p"], min_p=0.0, typical_p=1.0,
                                  temp=r["temperature"], repeat_penalty=1.0):
            steps.append(position(token, llm.scores[llm.n_tokens - 1], r["logprobs"]))
            tokens.append(token)
            if (not r["ignore_eos"] and llama_cpp.llama_vocab_is_eog(vocab, token)) or len(tokens) >= r["max_tokens"]:
                break
        answers.append({{"token_ids": tokens, "steps": steps}})
    return answers
"""


# Everything the tier can ask of llama.cpp in-process (the worker reports the same after a start).
start_llamacpp.capabilities = frozenset(  # type: ignore[attr-defined]
    {
        "prompt_logprobs",
        "seed",
        "stop_strings",
        "prefix_caching",
        "reset_prefix_cache",
        "chunked_prefill",
        "top_k_top_p",
        "ignore_eos",
        "top_logprobs",
    }
)
# Where llama.cpp's low-precision recipe differs from transformers' on purpose (names of
# recipes.LEGITIMATE): its Gemma graph scales the embeddings by sqrtf(n_embd), a float32 constant,
# on float32 activations; transformers rounds sqrt(hidden) to the dtype first
# (ggml-org/llama.cpp#21451 proposed matching that and was declined).
start_llamacpp.recipe_differences = {  # type: ignore[attr-defined]
    "embed_normaliser_float32": "Gemma's sqrt(hidden) kept in float32 (llama.cpp#21451)"
}
