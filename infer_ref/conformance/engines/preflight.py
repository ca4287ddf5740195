"""Before pytest starts: can the engine be started or reached at all?

An engine that is not installed, a server that does not answer or a factory that raises at its
start would make every test of the tier "not judged", after pages of empty tables repeating the
reason. ``infer-ref conformance`` asks here first and refuses such a run in one line, exit 7
(:class:`~infer_ref.errors.EngineUnavailable`, docs/errors.md). The checks cost no second start:

* an engine of the registry run in a venv of its own (vLLM, llama.cpp, ...): its interpreter is
  asked whether it can find the engine's package (no import; a start would take a minute);
* ``--endpoint URL``: a TCP connection to its host and port, then an HTTP request, each with a
  short timeout (the tier's own connect, in the first test, checks the model and the logprobs);
* an engine that runs in this Python (infer_ref, transformers, a user's ``module:FACTORY``):
  started once on the first checkpoint, as the tier would start it first, and handed to the tier's
  session (:func:`~infer_ref.conformance.engines.session.adopt_started`), which uses that start
  instead of making its own. Under pytest-xdist the workers start their own engines: no start here.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from infer_ref.conformance.engines.registry import BY_NAME, EngineRecord, not_installed_message
from infer_ref.errors import EngineUnavailable, UsageError

if TYPE_CHECKING:
    from infer_ref.conformance.engines.settings import TierSettings

CONNECT_TIMEOUT_S = 3.0  # a closed port answers at once; a host that drops packets waits this long
HTTP_TIMEOUT_S = 10.0  # a busy server answers a GET of /models well within this
FIND_SPEC = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"


def check_installed(engine: str) -> None:
    """A registry engine that runs in a venv of its own must be findable by that venv's interpreter
    (``$INFER_REF_VLLM_PYTHON``, ..., else this Python): refused in one line where it is not."""
    record = BY_NAME.get(engine)
    if record is None or record.python_env is None or record.module is None:
        return  # runs in this Python (checked by starting it) or a user's factory
    interpreter = os.environ.get(record.python_env) or sys.executable
    if not Path(interpreter).is_file():
        raise EngineUnavailable(_missing(record, interpreter, f"${record.python_env} names no file"))
    if not _finds(interpreter, record.module):
        raise EngineUnavailable(_missing(record, interpreter, f"no module named {record.module!r}"))


def _finds(interpreter: str, module: str) -> bool:
    """Whether ``interpreter`` finds ``module`` (located, not imported: an engine's import takes seconds)."""
    # The path as given, not resolved: a venv's python is a link to its base interpreter, so every
    # venv of one base resolves to the same file while each finds the packages of its own prefix.
    if os.path.abspath(interpreter) == os.path.abspath(sys.executable):
        return importlib.util.find_spec(module) is not None
    try:
        done = subprocess.run(
            [interpreter, "-c", FIND_SPEC, module], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _missing(record: EngineRecord, interpreter: str, reason: str) -> str:
    return f"--engine {record.name}: {not_installed_message(record, interpreter, reason)}"


def check_reachable(endpoint: str) -> None:
    """``--endpoint URL`` must accept a connection and answer HTTP: refused in one line otherwise."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--endpoint {endpoint!r}: expected an http(s) URL such as http://127.0.0.1:8000/v1")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise UsageError(f"--endpoint {endpoint!r}: {e}") from None
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise EngineUnavailable(
            f"--endpoint {endpoint}: nothing accepts connections at {parts.hostname}:{port} ({reason}): "
            "start the server first, or pass the URL it listens on"
        ) from None
    models = endpoint.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(models, timeout=HTTP_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        return  # it answers HTTP: what it serves is the tier's first test's to judge
    except (urllib.error.URLError, OSError) as e:
        raise EngineUnavailable(
            f"--endpoint {endpoint}: {parts.hostname}:{port} accepts connections but GET {models} got no HTTP "
            f"answer within {HTTP_TIMEOUT_S:g} s ({getattr(e, 'reason', e)})"
        ) from None


def start_first(settings: TierSettings, model_dirs: Sequence[Path]) -> None:
    """Start the engine of ``settings`` on the first of ``model_dirs`` as the tier's first test would,
    and keep it for the tier's session. Where it cannot start there, the other folders are tried: one
    that starts is stopped and the tests judge what they can ("not everything judged"); none: the run
    is refused in one line. A start the engine declines (``Unsupported``) is the tests' to report."""
    from infer_ref.conformance.engines.session import EngineSession, EngineStartError, keep_started
    from infer_ref.conformance.interface.contract import Unsupported

    reasons: list[str] = []
    for model_dir in model_dirs:
        session = EngineSession(settings)
        try:
            session.handle(model_dir, FIRST_KIND)
        except EngineStartError as e:
            reasons.append(str(e))
            continue
        except Unsupported:
            return
        if model_dir == model_dirs[0]:
            keep_started(session)  # the tier's first start
        else:
            session.stop_all()  # the tests start it where they need it
        return
    if reasons:
        others = f" (and on the {len(reasons) - 1} other checkpoint folders)" if len(reasons) > 1 else ""
        raise EngineUnavailable(reasons[0] + others)


FIRST_KIND = "stressed"  # the start most of the tier's tests judge (``started(model_dir)``'s default)
