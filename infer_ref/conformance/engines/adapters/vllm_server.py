"""vLLM's OpenAI-compatible server, started by the kit on 127.0.0.1 and judged through the HTTP adapter.

``launch_vllm_server`` runs ``engines/workers/vllm_serve.py`` (vLLM's api_server on the tier's
options, mapped exactly as offline) with vLLM's interpreter on a free port, waits until
``/v1/models`` answers and returns the running server; ``stop`` kills its process group.
``start_vllm_server`` is the matching :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
the handle's ``stop`` stops the server.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from infer_ref.conformance.engines.adapters.engine_venv import (
    check_model_dir,
    engine_interpreter,
    missing_engine,
    worker_env,
)
from infer_ref.conformance.engines.adapters.local_server import (
    LocalServer,
    free_port,
    launch_server,
    serve_and_connect,
)
from infer_ref.conformance.engines.adapters.openai_engine import OpenAIEngine
from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR
from infer_ref.conformance.engines.adapters.vllm import ENGINE, start_vllm
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import record

SERVE_SCRIPT = WORKERS_DIR / str(record("vllm-server").worker)
VllmServer = LocalServer  # the running server (url, process group, log)


def launch_vllm_server(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    enforce_eager: bool = True,
    start_timeout: float = 600.0,
) -> LocalServer:
    """Start vLLM's server on ``model_dir`` and wait until it answers (or say in one line why not)."""
    check_model_dir(model_dir)
    interpreter = engine_interpreter(ENGINE, python)
    port = free_port()
    argv = [
        interpreter,
        os.fspath(SERVE_SCRIPT),
        os.fspath(Path(model_dir).resolve()),
        json.dumps(asdict(options)),
        str(port),
        "1" if enforce_eager else "0",
    ]
    return launch_server(
        argv,
        port,
        label="vllm server",
        env=worker_env(),
        start_timeout=start_timeout,
        not_installed=missing_engine(ENGINE, interpreter),
    )


def start_vllm_server(
    model_dir: Path,
    options: EngineOptions,
    *,
    python: str | os.PathLike[str] | None = None,
    enforce_eager: bool = True,
    start_timeout: float = 600.0,
    request_timeout: float = 900.0,
) -> OpenAIEngine:
    """An EngineFactory: vLLM's server on ``model_dir`` behind the HTTP adapter; ``stop`` stops it."""
    server = launch_vllm_server(
        model_dir, options, python=python, enforce_eager=enforce_eager, start_timeout=start_timeout
    )
    return serve_and_connect(server, Path(model_dir), options, request_timeout=request_timeout)


__all__ = ["VllmServer", "free_port", "launch_vllm_server", "start_vllm_server"]

# What the tier can ask of a server it launches itself (it knows the options it started it with).
start_vllm_server.capabilities = start_vllm.capabilities  # type: ignore[attr-defined]
