"""An engine installed in a venv of its own: which interpreter runs it, the environment its
processes get, and the refusal of a folder that is no checkpoint before a start of a minute.

Shared by every engine the kit drives in another Python (vLLM, llama.cpp), in-process behind the
subprocess bridge or as a server the kit launches.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    WORKERS_DIR,
    BridgedEngine,
    EngineNotInstalled,
)
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.registry import EngineRecord, not_installed_message
from infer_ref.errors import DataError


def engine_python(python: str | os.PathLike[str] | None, env_var: str) -> str:
    """The engine's interpreter: ``python``, else ``$env_var``, else this one."""
    return os.fspath(python) if python is not None else os.environ.get(env_var) or sys.executable


def engine_interpreter(engine: EngineRecord, python: str | os.PathLike[str] | None = None) -> str:
    """The interpreter that runs ``engine``: ``python``, else the one its record's variable names
    (``$INFER_REF_VLLM_PYTHON``, ...), else this one."""
    if engine.python_env is None:
        raise ValueError(f"{engine.name} runs in this Python: its record names no venv")
    return engine_python(python, engine.python_env)


def missing_engine(engine: EngineRecord, interpreter: str) -> Callable[[str], str]:
    """``reason`` -> the message of ``engine`` missing from ``interpreter`` (what to install, and how)."""
    return lambda reason: not_installed_message(engine, interpreter, reason)


@contextlib.contextmanager
def named_when_missing(engine: EngineRecord, interpreter: str) -> Iterator[None]:
    """An :class:`EngineNotInstalled` raised inside (the worker could not import the engine) says
    which variable names the engine's venv and which script builds one."""
    try:
        yield
    except EngineNotInstalled as err:
        raise EngineNotInstalled(
            not_installed_message(engine, interpreter, str(err).split(": ", 1)[-1])
        ) from None


Bridged = TypeVar("Bridged", bound=BridgedEngine)


def start_bridged(
    cls: type[Bridged],
    engine: EngineRecord,
    interpreter: str,
    model_dir: Path,
    options: EngineOptions,
    *,
    start_timeout: float,
    request_timeout: float,
    extra: dict[str, Any],
) -> Bridged:
    """``engine``'s worker (its record's) started under ``interpreter`` behind the bridge as a ``cls``,
    asked to load ``model_dir`` with ``options`` and ``extra``; an engine the interpreter lacks is
    named with the venv to make."""
    with named_when_missing(engine, interpreter):
        started = cls.start(
            interpreter,
            WORKERS_DIR / str(engine.worker),
            Path(model_dir),
            options,
            label=engine.name,
            start_timeout=start_timeout,
            request_timeout=request_timeout,
            env=worker_env(),
            extra=extra,
        )
    assert isinstance(started, cls)
    return started


def installed_version(
    python: str, package: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> str | None:
    """``package``'s version as ``python`` sees it (its metadata: nothing is imported, which takes
    seconds for an engine), or None where it is not installed. ``OSError`` and
    ``subprocess.TimeoutExpired`` reach the caller, whose message names the engine."""
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    done = subprocess.run(
        [python, "-c", probe, package], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def worker_env() -> dict[str, str]:
    """The kit's environment minus what would make the venv's interpreter import the kit's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models; a shared machine
    return env


def check_model_dir(model_dir: Path) -> None:
    """Refuse, before a start of a minute, a folder that is no Hugging Face checkpoint."""
    if not (Path(model_dir) / "config.json").is_file():
        raise DataError(
            f"{model_dir} is not a Hugging Face checkpoint folder (no config.json): pass the folder "
            "that holds config.json and the weights"
        )
