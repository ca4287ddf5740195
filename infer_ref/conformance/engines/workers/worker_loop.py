"""The worker side of the subprocess bridge: JSON requests on stdin, JSON replies on a private fd.

A worker script calls :func:`serve` with one handler per operation. The bridge starts it as
``python WORKER --reply-fd N``: requests come one per line on stdin, and each gets exactly one
reply line on file descriptor N, ``{"ok": true, "result": ...}`` or
``{"ok": false, "kind": KIND, "error": ONE_LINE}``. Replies go to a descriptor of their own
because engines print to stdout and stderr at will; both of those go to the bridge's log file.

Standard library only: this file runs inside an engine's venv, where infer_ref is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

Handler = Callable[[dict[str, Any]], Any]


class Refused(Exception):
    """An option or request the engine cannot honour (becomes ``Unsupported`` in the kit)."""

    kind = "unsupported"


class NotInstalled(Exception):
    """The engine package is not importable in this interpreter."""

    kind = "missing"


def serve(handlers: dict[str, Handler], argv: list[str] | None = None) -> int:
    """Answer requests until ``stop`` or the end of stdin; returns the exit status."""
    replies = _open_reply_channel(sys.argv[1:] if argv is None else argv)
    _die_with_parent()
    for line in sys.stdin:
        if not line.strip():
            continue
        op, reply = _answer(handlers, line)
        _write(replies, reply)
        if op == "stop":
            break
    return 0


def _answer(handlers: dict[str, Handler], line: str) -> tuple[str, dict[str, Any]]:
    try:
        message = json.loads(line)
        op, args = message["op"], message.get("args") or {}
    except (ValueError, KeyError, TypeError) as err:
        return "", _failure("error", f"unreadable request {line[:80]!r}: {err}")
    handler = handlers.get(op)
    if handler is None:
        if op == "stop":  # a worker with nothing to release still stops
            return op, {"ok": True, "result": None}
        return op, _failure("error", f"unknown operation {op!r} (this worker knows {sorted(handlers)})")
    try:
        return op, {"ok": True, "result": handler(args)}
    except (Refused, NotInstalled) as err:
        return op, _failure(err.kind, str(err))
    except Exception as err:
        traceback.print_exc()  # the whole story goes to the log; the kit gets one line
        return op, _failure("error", f"{type(err).__name__}: {_first_line(err)}")


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "kind": kind, "error": message}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


def _write(replies: TextIO, reply: dict[str, Any]) -> None:
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


def _open_reply_channel(argv: list[str]) -> TextIO:
    """The reply descriptor from ``--reply-fd N``; then fd 1 is pointed at stderr (the log)."""
    if len(argv) < 2 or argv[0] != "--reply-fd":
        sys.exit("usage: WORKER --reply-fd N (this script is started by infer_ref's subprocess bridge)")
    fd = int(argv[1])
    os.set_inheritable(fd, False)  # the engine's own child processes must not hold the channel open
    replies = os.fdopen(fd, "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


def _die_with_parent() -> None:
    """Exit when the kit's process dies, even by SIGKILL (its atexit hooks never run then).

    A watchdog thread polls the parent id (a prctl death signal would fire when the parent's
    *thread* that started us ends, which a kit running engines from a thread pool would trip).
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def position_from_logits(np: Any, token: int, logits: Any, k: int) -> dict[str, Any]:
    """One position from its logits row (as the engine computed it): log-softmax in float64, the
    chosen token's logprob and the top ``k`` (ties in index order). ``np`` is the engine venv's numpy."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    logprobs = row - row.max()
    logprobs -= np.log(np.exp(logprobs).sum())
    top = np.argsort(-logprobs, kind="stable")[:k]
    return {
        "token": int(token),
        "logprob": float(logprobs[token]),
        "top": [[int(t), float(logprobs[t])] for t in top],
    }
