"""A child process that leads a process group of its own, logs to a file and is never left running.

Engines spawn processes of their own (vLLM's engine core, its model workers, a server's
front end). Started as a session leader, everything they spawn shares its process group, so one
``killpg`` ends it all: on :meth:`GroupedProcess.kill`, and for any still alive at interpreter exit.
Its stdout and stderr go to a log file that errors quote the end of.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

LOG_TAIL_LINES = 20

_LIVE: weakref.WeakSet[GroupedProcess] = weakref.WeakSet()


@atexit.register
def _kill_all_live() -> None:
    for process in list(_LIVE):
        process.kill()


class GroupedProcess:
    """``argv`` started in a new session with its output in ``log_path``; ``pass_fds`` are inherited."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        stdin: int | None = None,
    ) -> None:
        self._log_dir = Path(tempfile.mkdtemp(prefix="infer-ref-engine-"))
        self.log_path = self._log_dir / "engine.log"
        try:
            with open(self.log_path, "wb") as log:
                self.popen = subprocess.Popen(
                    list(argv),
                    stdin=stdin,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=tuple(pass_fds),
                    start_new_session=True,
                    env=env,
                )
        except OSError:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            raise
        self.killed = False
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> bool:
        """Whether the leader has exited, without reaping it (its pid keeps naming the group)."""
        try:
            info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def wait_exit(self, timeout: float) -> None:
        """Give the leader ``timeout`` seconds to exit by itself (its exit status then tells why)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the whole group, then reap the leader; idempotent. The log is kept."""
        if self.killed:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # the group outlives its leader: kill it first
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.popen.wait(timeout=30)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        _LIVE.discard(self)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "    (no log)"
        tail = text.splitlines()[-lines:]
        return "\n".join("    " + line[:300] for line in tail) if tail else "    (empty)"

    def remove_log(self) -> None:
        """After a clean stop nothing needs the log."""
        shutil.rmtree(self._log_dir, ignore_errors=True)
