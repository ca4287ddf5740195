"""An engine installed in a venv of its own: which interpreter runs it, the environment its
processes get, and the refusal of a folder that is no checkpoint before a start of a minute.

Shared by every engine the kit drives in another Python (vLLM, llama.cpp), in-process behind the
subprocess bridge or as a server the kit launches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infer_ref.errors import DataError


def engine_python(python: str | os.PathLike[str] | None, env_var: str) -> str:
    """The engine's interpreter: ``python``, else ``$env_var``, else this one."""
    return os.fspath(python) if python is not None else os.environ.get(env_var) or sys.executable


def installed_version(python: str, package: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> str | None:
    """``package``'s version as ``python`` sees it (its metadata: nothing is imported, which takes
    seconds for an engine), or None where it is not installed. ``OSError`` and
    ``subprocess.TimeoutExpired`` reach the caller, whose message names the engine."""
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    done = subprocess.run([python, "-c", probe, package], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def worker_env() -> dict[str, str]:
    """The kit's environment minus what would make the venv's interpreter import the kit's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models; a shared machine
    return env


def check_model_dir(model_dir: Path) -> None:
    """Refuse, before a start of a minute, a folder that is no Hugging Face checkpoint."""
    if not (Path(model_dir) / "config.json").is_file():
        raise DataError(f"{model_dir} is not a Hugging Face checkpoint folder (no config.json): pass the folder "
                        "that holds config.json and the weights")  # fmt: skip
