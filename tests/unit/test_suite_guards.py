"""The root conftest's guards, run on planted test files in a pytest of their own: a test that leaves
process-wide torch state or the environment changed fails, naming what changed (a fixture that
restores it passes); without CUDA the automatic device choice is ``meta``, so a test that leans on
it fails on a CPU as it would on a GPU machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from infer_ref.devices import AUTO_DEVICE_ENV

ROOT = Path(__file__).resolve().parents[2]

PLANTED = {
    "test_leaks_threads.py": """
import torch

def test_sets_threads():
    torch.set_num_threads(torch.get_num_threads() + 1)

def test_after_it():
    pass
""",
    "test_leaks_dtype_and_env.py": """
import os
import torch

def test_sets_dtype_and_env():
    torch.set_default_dtype(torch.float64)
    os.environ["INFER_REF_PLANTED"] = "1"
""",
    "test_restores.py": """
import pytest
import torch

@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    yield
    torch.set_num_threads(before)

def test_a_module_fixture_that_restores(one_thread):
    pass

def test_monkeypatch_restores(monkeypatch):
    monkeypatch.setenv("INFER_REF_PLANTED", "2")
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float16)

def test_the_automatic_device():
    from infer_ref.devices import default_device

    assert default_device().type == ("cuda" if torch.cuda.is_available() else "meta")
""",
}


def _own_suite_run(folder: Path, *options: str) -> str:
    """pytest over the planted files in ``folder`` with the repository's rootdir and settings (the
    guards hold for its own suite); its output."""
    env = {k: v for k, v in os.environ.items()
           if k not in (AUTO_DEVICE_ENV, "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "--rootdir", str(ROOT),
            "-c", str(ROOT / "pyproject.toml"), *options, str(folder)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, cwd=folder, env=env, timeout=300).stdout


def test_a_test_leaving_state_changed_fails_naming_it_and_restoring_fixtures_pass(tmp_path: Path) -> None:
    for name, text in PLANTED.items():
        (tmp_path / name).write_text(text)
    out = _own_suite_run(tmp_path)
    assert "6 passed, 2 errors" in out, out  # the two leaks fail their teardowns
    # Each leak is reported once, at the end of the module that made it.
    errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 2
    assert "test_leaks_threads.py::test_after_it" in errors[1]
    assert "test_leaks_dtype_and_env.py::test_sets_dtype_and_env" in errors[0]
    assert sum(line.startswith("process-wide state changed by a test of") for line in out.splitlines()) == 2
    assert "torch.get_default_dtype(): torch.float32 -> torch.float64" in out
    assert "os.environ['INFER_REF_PLANTED']: '<unset>' -> '1'" in out
    before, after = (int(n) for n in re.search(r"torch.get_num_threads\(\): (\d+) -> (\d+)", out).groups())
    assert after == before + 1


def test_one_thread_blocks_closed_out_of_order_restore_the_count_before_the_first() -> None:
    # pytest may finalize fixtures of two scopes in the order they were set up: the count must come
    # back all the same (a per-block save restored the count the other block had set: 1).
    import torch

    from infer_ref.conformance.profiles import one_thread

    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first, second = one_thread(), one_thread()
        first.__enter__()
        second.__enter__()
        assert torch.get_num_threads() == 1
        first.__exit__(None, None, None)
        assert torch.get_num_threads() == 1  # the second block still holds it
        second.__exit__(None, None, None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)


def test_each_xdist_worker_takes_its_share_of_the_cores(tmp_path: Path) -> None:
    # -n 2: each worker's torch runs on cores // 2 threads (at least one), not on every core (16 workers
    # x 16 threads made the README's command on a 16-core GPU host several times slower).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    expected = max(1, cores // 2)
    (tmp_path / "test_threads.py").write_text(f"""
import torch

def test_first():
    assert torch.get_num_threads() == {expected}, torch.get_num_threads()

def test_second():
    assert torch.get_num_threads() == {expected}, torch.get_num_threads()
""")
    out = _own_suite_run(tmp_path, "-n", "2")
    assert "2 passed" in out, out
