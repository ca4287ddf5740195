"""An engine's OpenAI-compatible server started by the kit on 127.0.0.1, judged through the HTTP adapter.

:func:`launch_server` runs a server command in a process group of its own on a free port, waits
until ``/v1/models`` lists a model and returns the running :class:`LocalServer`; any failure kills
the group and says in one line why (a launcher that refuses prints ``unsupported: REASON`` or
``missing: REASON`` last on stderr). :func:`serve_and_connect` puts the HTTP adapter on it, whose
``stop`` stops the server. Each engine's server adapter (vLLM's, llama.cpp's) only builds the command.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from infer_ref.conformance.engines.adapters.managed_process import GroupedProcess
from infer_ref.conformance.engines.adapters.openai_engine import OpenAIEngine
from infer_ref.conformance.engines.adapters.openai_http import connect
from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled, EngineWorkerError
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.interface.contract import Unsupported


class LocalServer:
    """A running server: ``url`` (``http://127.0.0.1:PORT/v1``), its process group, its log."""

    def __init__(self, process: GroupedProcess, url: str) -> None:
        self.process = process
        self.url = url

    def stop(self) -> None:
        """Kill the server's process group; idempotent."""
        if not self.process.killed:
            self.process.kill()
            self.process.remove_log()


def free_port() -> int:
    """A port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_server(
    argv: Sequence[str],
    port: int,
    *,
    label: str,
    env: dict[str, str],
    start_timeout: float,
    not_installed: Callable[[str], str],
) -> LocalServer:
    """Run ``argv`` (a server listening on ``port``) and wait until it lists a model.

    ``not_installed(reason)`` words the error of a launcher that found its engine missing.
    """
    try:
        process = GroupedProcess(list(argv), env=env)
    except OSError as err:
        raise EngineWorkerError(f"{label}: cannot run {argv[0]}: {err.strerror or err}") from None
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_listed(process, url, start_timeout, label, not_installed)
    except BaseException:
        process.kill()
        raise
    return LocalServer(process, url)


def serve_and_connect(
    server: LocalServer, model_dir: Path, options: EngineOptions, *, request_timeout: float
) -> OpenAIEngine:
    """The HTTP adapter on ``server`` (serving ``model_dir``); its ``stop`` stops the server."""
    try:
        engine = connect(server.url, Path(model_dir), options=options, timeout=request_timeout)
    except BaseException:
        server.stop()
        raise
    engine.on_stop = server.stop
    return engine


def _wait_until_listed(
    process: GroupedProcess, url: str, timeout: float, label: str, not_installed: Callable[[str], str]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.exited():
            process.wait_exit(1.0)
            _raise_exit_reason(process, label, not_installed)
        with (
            contextlib.suppress(urllib.error.URLError, OSError, ValueError),
            urllib.request.urlopen(url + "/models", timeout=5) as answer,
        ):
            if json.loads(answer.read()).get("data"):
                return
        time.sleep(1.0)
    process.kill()
    raise EngineWorkerError(
        f"{label}: {url}/models did not answer within {timeout:g} s; its log "
        f"{process.log_path} ends:\n{process.log_tail()}"
    )


def _raise_exit_reason(process: GroupedProcess, label: str, not_installed: Callable[[str], str]) -> None:
    """A launcher says ``unsupported: ...`` or ``missing: ...`` on its last lines when it refuses."""
    process.kill()
    for line in reversed(process.log_tail(5).splitlines()):
        line = line.strip()
        if line.startswith("unsupported: "):
            process.remove_log()
            raise Unsupported(f"{label}: {line.removeprefix('unsupported: ')}")
        if line.startswith("missing: "):
            process.remove_log()
            raise EngineNotInstalled(not_installed(line.removeprefix("missing: ")))
    raise EngineWorkerError(
        f"{label} exited (status {process.returncode}) before answering; its log "
        f"{process.log_path} ends:\n{process.log_tail()}"
    )
