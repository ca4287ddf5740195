"""scripts/gpu_ci.sh, rehearsed on a CPU: the same plumbing as on the GPU runner (lanes, budget,
summary, result file, exit status, ``record``, CONTRIBUTING's block) with a stand-in for each
stage's command; and CONTRIBUTING.md's GPU CI block matches the committed result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["readme", "gpu", "engine", "golden", "bench"]


def rehearse(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / "scripts" / "gpu_ci.py"), "run", str(out), "--standin", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture(scope="module")
def figures(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("contributing_figures")


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("pass")
    return rehearse(out), out


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("fail")
    return rehearse(out, "--fail", "gpu"), out


def test_a_passing_run_exits_0_with_every_stage_in_the_summary_and_the_result(passing: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = passing
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "gpu-ci.json").read_text())
    assert (result["mode"], result["complete"], result["passed"]) == ("standin", True, True)
    assert [s["key"] for s in result["stages"]] == STAGES
    # Each stand-in leaves one passing and one skipped test (the golden one: one file verified).
    assert all(s["counts"] == {"passed": 1, "failed": 0, "skipped": 0 if s["key"] == "golden" else 1} for s in result["stages"])
    assert result["versions"]["torch"] == torch.__version__.split("+")[0] or result["versions"]["torch"] == torch.__version__
    summary = (out / "summary.txt").read_text()
    assert summary.splitlines()[-1].startswith("PASSED in ")
    assert all(s["name"][:62] in summary for s in result["stages"])
    assert proc.stdout.count("=== stage done in ") == 5
    assert sorted(p.name for p in out.iterdir()) == ["benchmark.json", "gpu-ci.json", "gpu-junit.xml", "log.txt", "summary.txt"]


def test_a_failing_stage_fails_the_run_and_the_other_stages_still_run(failing: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = failing
    assert proc.returncode == 1
    result = json.loads((out / "gpu-ci.json").read_text())
    by_key = {s["key"]: s for s in result["stages"]}
    assert list(by_key) == STAGES and result["passed"] is False
    assert (by_key["gpu"]["exit_status"], by_key["gpu"]["counts"]["failed"]) == (1, 1)
    assert all(by_key[k]["exit_status"] == 0 for k in STAGES if k != "gpu")
    assert (out / "summary.txt").read_text().splitlines()[-1].startswith("FAILED in ")
    assert "stand-in for gpu: fail" in proc.stdout  # the failing stage's output is shown


def test_the_shell_entry_point_passes_the_budget_and_the_exit_status_on(tmp_path: Path) -> None:
    """A spent budget fails every stage not run, and the run."""
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CI_STANDIN": "1", "GPU_CI_BUDGET": "0", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_ci.sh")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu-ci.json").read_text())
    assert [s["exit_status"] for s in result["stages"]] == [124] * 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a machine without CUDA")
def test_without_a_gpu_the_real_run_refuses_to_start(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "scripts" / "gpu_ci.py"), "run", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device visible" in proc.stderr
    assert not (tmp_path / "gpu-ci.json").exists()


def test_a_rehearsal_is_never_recorded(passing: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = passing
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_ci.py"), "record", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode != 0
    assert "a standin run: only a run on a GPU is recorded" in proc.stderr


def test_the_block_lists_each_stage_and_the_slowest_gpu_tests(figures: ModuleType, failing: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path) -> None:
    _, out = failing
    result = json.loads((out / "gpu-ci.json").read_text())
    result.update(gpu="NVIDIA X", tree="abc1234", install_s=7.4)
    path = tmp_path / "gpu_ci.json"
    path.write_text(json.dumps(result))
    block = figures.gpu_block(path)
    assert block.startswith(figures.GPU_MARKERS[0]) and block.endswith(figures.GPU_MARKERS[1])
    assert f"tree abc1234, {result['date']}, NVIDIA X with {result['cpus']} CPUs" in block
    assert "**FAILED in " in block and "the install before them: 7 s" in block
    gpu = result["stages"][1]
    assert f"| {gpu['name']} | {gpu['seconds']:.0f} | 1 | 0 | 1 | 1 |" in block
    assert "| 0.5 | `tests/standin.py::test_gpu` |" in block
    assert "No run" in figures.gpu_block(tmp_path / "absent.json")


def test_contributing_shows_the_committed_gpu_ci_result(figures: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate with `python scripts/gpu_ci.py record OUT` (or `contributing_figures.py gpu ... --write`)."""
    monkeypatch.chdir(ROOT)
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start, end = figures.GPU_MARKERS
    shown = start + text.split(start, 1)[1].split(end, 1)[0] + end
    assert shown == figures.gpu_block(Path("benchmarks/log/gpu_ci.json")), (
        "CONTRIBUTING.md's gpu-ci block is stale: python scripts/contributing_figures.py gpu "
        "benchmarks/log/gpu_ci.json --write CONTRIBUTING.md"
    )


def test_the_gpu_stage_draws_from_a_recorded_seed_and_refuses_a_bad_one(passing: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path) -> None:
    _, out = passing
    result = json.loads((out / "gpu-ci.json").read_text())
    assert result["hypothesis_seed"] == 0
    assert result["stages"][1]["name"].endswith("--hypothesis-seed=0")
    searched = rehearse(tmp_path / "search", env={"GPU_CI_SEED": "7"})
    assert searched.returncode == 0, searched.stdout + searched.stderr
    result = json.loads((tmp_path / "search" / "gpu-ci.json").read_text())
    assert (result["hypothesis_seed"], result["stages"][1]["name"].split()[-1]) == (7, "--hypothesis-seed=7")
    for bad in ("-1", "seven", ""):
        proc = rehearse(tmp_path / f"bad{bad}", env={"GPU_CI_SEED": bad})
        assert proc.returncode != 0
        assert f"GPU_CI_SEED must be a non-negative integer, got {bad!r}" in proc.stderr
        assert not (tmp_path / f"bad{bad}" / "gpu-ci.json").exists()


PLANTED_DRAWS = '''
import os
from hypothesis import given, settings, strategies as st

@settings(max_examples=10, deadline=None, database=None)
@given(st.integers(0, 10**9))
def test_{name}(x):
    with open(os.path.join(os.environ["DRAWS"], "{name}"), "a") as fh:
        fh.write(f"{{x}}\\n")
'''


def draws(tmp_path: Path, run: str, *seed: str) -> dict[str, str]:
    """Each planted test's drawn values in one run of a child pytest under -n 2 (workers take tests
    in whatever order they are free)."""
    tests, record = tmp_path / run / "tests", tmp_path / run / "draws"
    tests.mkdir(parents=True)
    record.mkdir()
    for name in ("a", "b", "c", "d"):
        (tests / f"test_{name}.py").write_text(PLANTED_DRAWS.format(name=name))
    # Without CI in the environment: with it, Hypothesis loads its derandomized ci profile by itself.
    # Only the two plugins the gpu stage's draws go through (no torch to import: seconds, not tens).
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"DRAWS": str(record), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    plugins = ["-p", "xdist.plugin", "-p", "_hypothesis_pytestplugin", "-p", "no:cacheprovider"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", *plugins, "-n", "2", *seed, str(tests)],
                          capture_output=True, text=True, cwd=tests, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name: p.read_text() for p in sorted(record.iterdir())}


def test_the_seed_makes_the_gpu_stages_draws_repeat_under_xdist(tmp_path: Path) -> None:
    """What the gpu stage's --hypothesis-seed buys: two runs draw the same examples for each test,
    whichever worker ran it; without the seed, two runs draw different ones."""
    seeded = [draws(tmp_path, f"seeded{i}", "--hypothesis-seed=0") for i in range(2)]
    assert len(seeded[0]) == 4 and seeded[0] == seeded[1]
    assert draws(tmp_path, "random0") != draws(tmp_path, "random1")
