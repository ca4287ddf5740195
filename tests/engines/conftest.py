"""The engine tests: the ``vllm`` marker, and the interpreter that has vLLM (or a skip naming the fix)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from infer_ref.conformance.engines.adapters.llamacpp_gguf import LlamaCppSourceMissing, llamacpp_source
from infer_ref.conformance.engines.registry import EngineRecord, record

# marker -> the engine its tests run (in the engine's own venv, skipped without it)
MARKED = {"vllm": "vllm", "llamacpp": "llama.cpp", "ctranslate2": "ctranslate2", "ortgenai": "onnxruntime-genai",
          "openvino": "openvino"}


def pytest_configure(config: pytest.Config) -> None:
    for marker, name in MARKED.items():
        engine = record(name)
        config.addinivalue_line("markers", f"{marker}: runs {engine.label} (in its own venv, {engine.python_env}); skipped without it")


def _interpreter(engine: EngineRecord) -> str:
    """The python ``engine``'s variable names, where it has the engine (else the test is skipped, naming the fix)."""
    assert engine.python_env and engine.module
    python = os.environ.get(engine.python_env)
    if not python or not _finds(python, engine.module):
        pytest.skip(f"{engine.label} not installed: set {engine.python_env} to a venv's python that has {engine.needs} "
                    f"({engine.install})")
    return python


def _finds(python: str, package: str) -> bool:
    """Whether ``python`` finds ``package`` (without importing it: that takes seconds)."""
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)"
    try:
        return subprocess.run([python, "-c", check], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def vllm_interpreter() -> str:
    return _interpreter(record("vllm"))


@pytest.fixture(scope="session")
def llamacpp_interpreter() -> str:
    """The python that has llama-cpp-python, with the converter's tree found (its venv's, or named)."""
    python = _interpreter(record("llama.cpp"))
    try:
        llamacpp_source(None, python)
    except LlamaCppSourceMissing as err:
        pytest.skip(str(err))
    return python


@pytest.fixture(scope="session")
def ortgenai_interpreter() -> str:
    """The python that has onnxruntime-genai (and so its model builder)."""
    return _interpreter(record("onnxruntime-genai"))


@pytest.fixture(scope="session")
def openvino_interpreter() -> str:
    """The python that has openvino-genai and, beside it, optimum-cli."""
    python = _interpreter(record("openvino"))
    if not os.path.isfile(os.path.join(os.path.dirname(python), "optimum-cli")):
        pytest.skip(f"OpenVINO GenAI needs optimum-cli beside {python} ({record('openvino').install})")
    return python


@pytest.fixture(autouse=True)
def _engine_logs_in_tmp_path(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed engine keeps its log for the user to read; in tests it goes to pytest's temporary folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("engine-logs")))


@pytest.fixture(scope="session")
def ct2_interpreter() -> str:
    """The python that has ctranslate2 (and its converter beside it)."""
    return _interpreter(record("ctranslate2"))
