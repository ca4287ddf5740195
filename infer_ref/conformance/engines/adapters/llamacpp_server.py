"""llama-cpp-python's OpenAI-compatible server, started by the kit on 127.0.0.1 and judged through
the HTTP adapter.

``start_llamacpp_server`` converts the folder as the in-process adapter does (llama.cpp's own
converter, cached), runs ``engines/workers/llamacpp_serve.py`` (``python -m llama_cpp.server`` with
the options mapped exactly as in-process) with llama-cpp-python's interpreter on a free port, and
returns the HTTP adapter on it (its text dialect: the server takes prompts as text only); the
handle's ``stop`` kills the server's process group.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

from infer_ref.conformance.engines.adapters.engine_venv import installed_version, missing_engine, worker_env
from infer_ref.conformance.engines.adapters.llamacpp import ENGINE, check_kv_cache_type, convert_for_llamacpp
from infer_ref.conformance.engines.adapters.local_server import free_port, launch_server, serve_and_connect
from infer_ref.conformance.engines.adapters.openai_engine import OpenAIEngine
from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record

SERVE_SCRIPT = WORKERS_DIR / str(record("llama.cpp-server").worker)


def start_llamacpp_server(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    kv_cache_type: str | None = None,
    threads: int = 1,
    start_timeout: float = 300.0,
    request_timeout: float = 600.0,
) -> OpenAIEngine:
    """An EngineFactory: ``llama_cpp.server`` on ``model_dir`` converted, behind the HTTP adapter."""
    check_kv_cache_type(kv_cache_type)
    interpreter, converted = convert_for_llamacpp(
        model_dir, options, python=python, source=source, cache=cache
    )
    port = free_port()
    argv = [
        interpreter,
        os.fspath(SERVE_SCRIPT),
        os.fspath(converted.path),
        json.dumps(asdict(options)),
        kv_cache_type or options.dtype,
        str(threads),
        str(port),
    ]
    server = launch_server(
        argv,
        port,
        label="llama.cpp server",
        env=worker_env(),
        start_timeout=start_timeout,
        not_installed=missing_engine(ENGINE, interpreter),
    )
    engine = serve_and_connect(server, Path(model_dir), options, request_timeout=request_timeout)
    engine.name = f"llama_cpp.server ({_installed(interpreter)}, on 127.0.0.1)"  # the server names no version
    return engine


def _installed(interpreter: str) -> str:
    """``llama-cpp-python X`` as installed beside ``interpreter`` (its package metadata, no import)."""
    try:
        version = installed_version(interpreter, "llama_cpp_python", worker_env())
    except (OSError, subprocess.TimeoutExpired):
        version = None
    return f"llama-cpp-python {version}" if version else "llama-cpp-python, version unknown"


# The server serves one sequence at a time (no batch, no KV pool) and always reuses the previous
# request's prefix. It takes prompts as text: the tier draws text-stable prompts for it, and the HTTP
# adapter's text dialect sends a prompt only where the server's tokenizer gives its ids back. No prompt
# logprobs: its ``echo`` pairs logits rows with prompt tokens
# as if a BOS led the prompt (without one, every row is one position off) and answers none for
# the first token after the BOS (docs/engines.md).
start_llamacpp_server.capabilities = frozenset(  # type: ignore[attr-defined]
    {"seed", "stop_strings", "prefix_caching", "chunked_prefill", "top_k_top_p", "top_logprobs"}
)
start_llamacpp_server.takes_text_prompts = True  # type: ignore[attr-defined]
