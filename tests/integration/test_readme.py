"""README.md's examples, run as written: the public API the README promises stays the API.

The Python block is executed as one script from the repository root (its fixture paths are
relative to it); the shell lines that only need the embedded fixtures run as commands. A renamed
function, a moved import path or a changed argument in the library fails here before a user
copies the README and finds out.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _blocks(language: str) -> list[str]:
    """The fenced code blocks of README.md marked ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def _env() -> dict[str, str]:
    # The checkout first on the path, one thread for the tiny fixtures, no user model folder.
    return {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "OMP_NUM_THREADS": "1"}


def test_readme_has_one_python_example() -> None:
    assert len(_blocks("python")) == 1, "README.md should hold exactly one ```python block (the API tour)"


def test_python_api_example_runs() -> None:
    (script,) = _blocks("python")
    prelude = "import torch\ntorch.set_num_threads(1)\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + script], capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, f"README's Python example failed:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr


def _fixture_commands() -> list[str]:
    """``infer-ref`` command lines of the README that run on the embedded fixtures alone (no
    user files, no GPU, no install step): the ones a new user types first."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("#", 1)[0].split("&&"):
                words = shlex.split(part)
                if words[:2] == ["infer-ref", "generate"] and "cuda" not in words:
                    commands.append(shlex.join(words))
    return commands


def test_readme_names_a_fixture_command() -> None:
    assert _fixture_commands(), "README.md should show an `infer-ref generate` command on the embedded fixture"


@pytest.mark.parametrize("command", _fixture_commands())
def test_fixture_command_runs(command: str) -> None:
    # From the checkout's root, as a new user types it: every file the command names ships with it.
    args = shlex.split(command)[1:]
    proc = subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", *args, "--device", "cpu", "--max-new-tokens", "4"],
        capture_output=True, text=True, env=_env(), timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{command!r} failed:\n{proc.stderr[-4000:]}"
