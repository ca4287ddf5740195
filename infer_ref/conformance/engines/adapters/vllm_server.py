"""vLLM's OpenAI-compatible server, started by the kit on 127.0.0.1 and judged through the HTTP adapter.

``launch_vllm_server`` runs ``engines/workers/vllm_serve.py`` (vLLM's api_server on the tier's
options, mapped exactly as offline) with vLLM's interpreter on a free port, waits until
``/v1/models`` answers and returns the running server; ``stop`` kills its process group.
``start_vllm_server`` is the matching :class:`~infer_ref.conformance.engines.protocol.EngineFactory`:
the handle's ``stop`` stops the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

from infer_ref.conformance.engines.adapters.managed_process import GroupedProcess
from infer_ref.conformance.engines.adapters.openai_engine import OpenAIEngine
from infer_ref.conformance.engines.adapters.openai_http import connect
from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    WORKERS_DIR,
    EngineNotInstalled,
    EngineWorkerError,
)
from infer_ref.conformance.engines.adapters.vllm import (
    check_model_dir,
    not_installed_message,
    start_vllm,
    vllm_python,
    worker_env,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.interface.contract import Unsupported

SERVE_SCRIPT = WORKERS_DIR / "vllm_serve.py"


class VllmServer:
    """A running vLLM server: ``url`` (``http://127.0.0.1:PORT/v1``), its process group, its log."""

    def __init__(self, process: GroupedProcess, url: str) -> None:
        self.process = process
        self.url = url

    def stop(self) -> None:
        """Kill the server's process group; idempotent."""
        if not self.process.killed:
            self.process.kill()
            self.process.remove_log()


def launch_vllm_server(
    model_dir: Path, options: EngineOptions, *, python: str | os.PathLike[str] | None = None,
    enforce_eager: bool = True, start_timeout: float = 600.0,
) -> VllmServer:  # fmt: skip
    """Start vLLM's server on ``model_dir`` and wait until it answers (or say in one line why not)."""
    check_model_dir(model_dir)
    interpreter = vllm_python(python)
    port = free_port()
    argv = [interpreter, os.fspath(SERVE_SCRIPT), os.fspath(Path(model_dir).resolve()),
            json.dumps(asdict(options)), str(port), "1" if enforce_eager else "0"]  # fmt: skip
    try:
        process = GroupedProcess(argv, env=worker_env())
    except OSError as err:
        raise EngineWorkerError(f"vllm server: cannot run {interpreter}: {err.strerror or err}") from None
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_listed(process, url, start_timeout, interpreter)
    except BaseException:
        process.kill()
        raise
    return VllmServer(process, url)


def start_vllm_server(
    model_dir: Path, options: EngineOptions, *, python: str | os.PathLike[str] | None = None,
    enforce_eager: bool = True, start_timeout: float = 600.0, request_timeout: float = 900.0,
) -> OpenAIEngine:  # fmt: skip
    """An EngineFactory: vLLM's server on ``model_dir`` behind the HTTP adapter; ``stop`` stops it."""
    server = launch_vllm_server(model_dir, options, python=python, enforce_eager=enforce_eager,
                                start_timeout=start_timeout)  # fmt: skip
    try:
        engine = connect(server.url, Path(model_dir), options=options, timeout=request_timeout)
    except BaseException:
        server.stop()
        raise
    engine.on_stop = server.stop
    return engine


def free_port() -> int:
    """A port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_listed(process: GroupedProcess, url: str, timeout: float, interpreter: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.exited():
            process.wait_exit(1.0)
            _raise_exit_reason(process, interpreter)
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError), \
                urllib.request.urlopen(url + "/models", timeout=5) as answer:  # fmt: skip
            if json.loads(answer.read()).get("data"):
                return
        time.sleep(1.0)
    process.kill()
    raise EngineWorkerError(f"vllm server: {url}/models did not answer within {timeout:g} s; its log "
                            f"{process.log_path} ends:\n{process.log_tail()}")  # fmt: skip


def _raise_exit_reason(process: GroupedProcess, interpreter: str) -> None:
    """The serve script says ``unsupported: ...`` or ``missing: ...`` on its last lines when it refuses."""
    process.kill()
    for line in reversed(process.log_tail(5).splitlines()):
        line = line.strip()
        if line.startswith("unsupported: "):
            process.remove_log()
            raise Unsupported(f"vllm server: {line.removeprefix('unsupported: ')}")
        if line.startswith("missing: "):
            process.remove_log()
            raise EngineNotInstalled(not_installed_message(interpreter, line.removeprefix("missing: ")))
    raise EngineWorkerError(f"vllm server exited (status {process.returncode}) before answering; its log "
                            f"{process.log_path} ends:\n{process.log_tail()}")  # fmt: skip


# What the tier can ask of a server it launches itself (it knows the options it started it with).
start_vllm_server.capabilities = start_vllm.capabilities  # type: ignore[attr-defined]
