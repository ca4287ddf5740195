"""A module the user names (``--impl``, ``--engine module:FACTORY``, ``golden verify --impl``) is
found in the working directory, as ``python -m`` finds it: no ``PYTHONPATH`` needed, in a checkout
or not (docs/adapters.md, docs/conformance.md). Each command runs from a scratch folder holding the
user's module; the path holds infer_ref alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"
GOLDEN = ROOT / "fixtures" / "golden" / "llama-tiny.cpu-float32.json"
# The user's modules: the kit's own adapter and engine factory under names of their own.
MY_ADAPTER = "from infer_ref.conformance.adapters.reference import INFER_REF as ADAPTER\n"
MY_ENGINE = "from infer_ref.conformance.engines.adapters.infer_ref_engine import start_infer_ref as start\n"


def _infer_ref(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (cwd / "my_adapter.py").write_text(MY_ADAPTER, encoding="utf-8")
    (cwd / "my_engine.py").write_text(MY_ENGINE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": ""}
    # -P: the working directory is not put on the path, as under the console script (python -c would put it there)
    code = "import sys; from infer_ref.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-P", "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


@pytest.mark.kit_run
def test_conformance_impl_is_found_in_the_working_directory(tmp_path: Path) -> None:
    run = _infer_ref(tmp_path, "conformance", "--impl", "my_adapter:ADAPTER", "-k", "test_reset", "--", "-q")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "my_adapter:ADAPTER" in run.stdout, run.stdout[-3000:]


@pytest.mark.kit_run
def test_engine_factory_is_found_in_the_working_directory_by_every_xdist_worker(tmp_path: Path) -> None:
    run = _infer_ref(tmp_path, "conformance", "--engine", "my_engine:start", "--model-dir", str(LLAMA), "-n", "2",
                     "-k", "test_stopping")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-3000:]


@pytest.mark.kit_run
def test_golden_verify_impl_is_found_in_the_working_directory(tmp_path: Path) -> None:
    run = _infer_ref(tmp_path, "golden", "verify", str(GOLDEN), "--impl", "my_adapter:ADAPTER", "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("PASS") and "[my_adapter:ADAPTER" in run.stdout, run.stdout


def test_a_module_that_is_nowhere_is_refused_naming_the_working_directory(tmp_path: Path) -> None:
    run = _infer_ref(tmp_path, "conformance", "--impl", "not_my_adapter:ADAPTER")
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == (
        f"infer-ref: error: --impl 'not_my_adapter:ADAPTER': no module 'not_my_adapter' on the path or in the working "
        f"directory {tmp_path} (expected module:OBJECT, OBJECT being an infer_ref.conformance.interface.adapter.Adapter "
        "or a callable returning one, e.g. infer_ref.conformance.adapters.reference:INFER_REF)"
    ), run.stderr


def test_an_object_that_is_no_adapter_is_refused_before_pytest_naming_the_option_typed(tmp_path: Path) -> None:
    (tmp_path / "not_an_adapter.py").write_text("X = 'a string'\n", encoding="utf-8")
    for command in (["conformance"], ["golden", "verify", str(GOLDEN)]):
        run = _infer_ref(tmp_path, *command, "--impl", "not_an_adapter:X")
        assert run.returncode == 2, run.stderr
        assert run.stderr.startswith("infer-ref: error: --impl 'not_an_adapter:X' is a str, expected an "
                                     "infer_ref.conformance.interface.adapter.Adapter"), run.stderr
        assert len(run.stderr.splitlines()) == 1 and "--ir-impl" not in run.stderr, run.stderr
