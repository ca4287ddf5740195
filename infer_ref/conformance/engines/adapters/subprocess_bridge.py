"""An engine that lives in another interpreter (its own venv), driven over JSON lines.

:class:`BridgedEngine` is an :class:`~infer_ref.conformance.engines.protocol.EngineHandle` whose
work is done by a worker script (see ``engines/workers/worker_loop.py`` for the worker's side)
started with the engine's Python. The bridge knows no engine: the vLLM adapter and any other
one that needs its own venv pass their worker script and start arguments.

The worker's process is the leader of a process group of its own, so everything the engine
spawns is killed with it: on :meth:`BridgedEngine.stop`, on any error (a crash, a timeout, a
reply that is not the protocol's) and at interpreter exit. Its stdout and stderr go to a log file;
when it dies, the error names the log and shows its last lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from infer_ref.conformance.engines.adapters.managed_process import GroupedProcess
from infer_ref.conformance.engines.adapters.wire import output_from_dict, request_to_dict
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import EXIT_MISSING, InferRefError

WORKERS_DIR = Path(__file__).resolve().parent.parent / "workers"


class EngineWorkerError(InferRefError, RuntimeError):
    """The engine's worker failed; the message is one line, then the log's tail where it died."""


class WorkerDied(EngineWorkerError):
    """The worker exited (or closed its reply channel) while a reply was awaited."""


class WorkerTimeout(EngineWorkerError):
    """No reply within the operation's time limit: the worker was killed."""


class WorkerProtocolError(EngineWorkerError):
    """The worker answered something that is not the bridge's protocol: it was killed."""


class EngineNotInstalled(EngineWorkerError):
    """The engine's package is not importable by the interpreter the worker runs with."""

    exit_code = EXIT_MISSING


class WorkerProcess:
    """One worker script under ``python``: send an operation, get its result or a clear error."""

    def __init__(
        self, python: str | os.PathLike[str], script: Path, *, label: str, env: dict[str, str] | None = None
    ) -> None:
        self.label = label
        read_fd, write_fd = os.pipe()
        try:
            self._process = GroupedProcess(
                [os.fspath(python), os.fspath(script), "--reply-fd", str(write_fd)],
                env=env,
                pass_fds=(write_fd,),
                stdin=subprocess.PIPE,
            )
        except OSError as err:
            os.close(read_fd)
            raise EngineWorkerError(f"{label}: cannot run {python}: {err.strerror or err}") from None
        finally:
            os.close(write_fd)  # the worker holds the only write end: its exit closes the channel
        self._replies = read_fd
        self._buffer = b""
        self._dead = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        """False once the worker was stopped, killed or found dead."""
        return not self._dead

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def call(self, op: str, args: dict[str, Any] | None = None, *, timeout: float) -> Any:
        """Send ``op`` and return its result; any failure kills the worker and raises one error."""
        if self._dead:
            raise EngineWorkerError(f"{self.label}: the engine was stopped or has failed; start a new one")
        stdin = self._process.popen.stdin
        try:
            assert stdin is not None
            stdin.write((json.dumps({"op": op, "args": args or {}}) + "\n").encode())
            stdin.flush()
        except OSError:  # BrokenPipeError: it is gone
            self._process.wait_exit(2.0)
            self._fail(WorkerDied, f"exited before {op!r} could be sent")
        reply = self._read_reply(op, timeout)
        return self._unwrap(op, reply)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the worker to stop, then kill whatever is left of its group; idempotent."""
        if self._dead:
            return
        with contextlib.suppress(EngineWorkerError):
            self.call("stop", timeout=timeout)
        self.kill()
        self._process.remove_log()

    def kill(self) -> None:
        """Kill the worker's whole process group (the log is kept)."""
        if self._dead:
            return
        self._dead = True
        self._process.kill()
        with contextlib.suppress(OSError):
            os.close(self._replies)

    # -- reading replies -------------------------------------------------------------------------

    def _read_reply(self, op: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(WorkerTimeout, f"no answer to {op!r} within {timeout:g} s")
            ready, _, _ = select.select([self._replies], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(self._replies, 1 << 20)
                if not chunk:  # the channel closes when the worker exits: let it finish exiting
                    self._process.wait_exit(2.0)
                    self._fail(WorkerDied, f"died during {op!r}")
                self._buffer += chunk
            elif self._process.exited():
                self._fail(WorkerDied, f"died during {op!r}")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            self._fail(WorkerProtocolError, f"answered {op!r} with a line that is not JSON: {line[:120]!r}")
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self._fail(WorkerProtocolError, f"answered {op!r} without an 'ok' field: {line[:120]!r}")
        return reply

    def _unwrap(self, op: str, reply: dict[str, Any]) -> Any:
        if reply["ok"]:
            return reply.get("result")
        kind, message = reply.get("kind"), str(reply.get("error", "(no message)"))
        if kind == "unsupported":
            raise Unsupported(f"{self.label}: {message}")
        if kind == "missing":
            self.kill()
            self._process.remove_log()
            raise EngineNotInstalled(f"{self.label}: {message}")
        if op == "generate":
            # An engine whose step raised is in no known state (vLLM's then spins on its next call,
            # never answering): it is killed, and a caller that wants more starts a new one.
            self.kill()
            raise EngineWorkerError(
                f"{self.label}: {op} failed, the engine was stopped: {message} (log: {self.log_path})"
            )
        raise EngineWorkerError(f"{self.label}: {op} failed: {message} (log: {self.log_path})")

    def protocol_error(self, what: str) -> NoReturn:
        """The worker answered outside the protocol: kill it and say what it answered."""
        self._fail(WorkerProtocolError, what)

    def _fail(self, error: type[EngineWorkerError], what: str) -> NoReturn:
        self.kill()
        status = self._process.returncode
        code = f" (exit status {status})" if status is not None and error is WorkerDied else ""
        raise error(
            f"{self.label}: the worker {what}{code}; its log {self.log_path} "
            f"ends:\n{self._process.log_tail()}"
        )


class BridgedEngine:
    """An EngineHandle over a :class:`WorkerProcess` speaking start/generate/reset_prefix_cache/stop.

    The worker's ``start`` result names the engine and its capabilities:
    ``{"name": str, "capabilities": [str], "versions": {str: str}}``.
    """

    def __init__(
        self, worker: WorkerProcess, start_result: dict[str, Any], *, request_timeout: float
    ) -> None:
        self._worker = worker
        self._request_timeout = request_timeout
        self.name: str = str(start_result["name"])
        self.capabilities: frozenset[str] = frozenset(start_result.get("capabilities", ()))
        self.versions: dict[str, str] = dict(start_result.get("versions", {}))
        self.start_result = start_result  # all the worker said at start (e.g. the engine's settings)

    @classmethod
    def start(
        cls,
        python: str | os.PathLike[str],
        script: Path,
        model_dir: Path,
        options: EngineOptions,
        *,
        label: str,
        start_timeout: float = 600.0,
        request_timeout: float = 300.0,
        env: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> BridgedEngine:
        """Start ``script`` under ``python`` and ask it to load ``model_dir`` with ``options``."""
        worker = WorkerProcess(python, script, label=label, env=env)
        try:
            args = {"model_dir": os.fspath(model_dir), "options": asdict(options), **(extra or {})}
            result = worker.call("start", args, timeout=start_timeout)
            if not isinstance(result, dict) or "name" not in result:
                worker.protocol_error(f"answered 'start' without an engine name: {result!r:.120}")
            return cls(worker, result, request_timeout=request_timeout)
        except BaseException:
            worker.kill()
            raise

    @property
    def worker(self) -> WorkerProcess:
        return self._worker

    @property
    def alive(self) -> bool:
        """False once the engine was stopped or has failed (the tier then starts a new one)."""
        return self._worker.alive

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        result = self._worker.call(
            "generate", {"requests": [request_to_dict(r) for r in requests]}, timeout=self._request_timeout
        )
        if not isinstance(result, list) or len(result) != len(requests):
            got = f"{len(result)} answers" if isinstance(result, list) else repr(result)[:80]
            self._worker.protocol_error(f"answered {len(requests)} requests with {got}")
        try:
            return [output_from_dict(item) for item in result]
        except KeyError as err:
            self._worker.protocol_error(f"answered 'generate' with a malformed output: no field {err}")
        except (TypeError, ValueError) as err:
            self._worker.protocol_error(f"answered 'generate' with a malformed output: {err}")

    def reset_prefix_cache(self) -> None:
        self._worker.call("reset_prefix_cache", timeout=self._request_timeout)

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        """An operation beyond the protocol that this worker offers (e.g. ``stats``)."""
        return self._worker.call(op, args, timeout=self._request_timeout)

    def stop(self) -> None:
        self._worker.stop()
