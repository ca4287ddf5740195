"""The GPU runner's CI: the suite as its users run it on one GPU machine, in at most 10 minutes.

    OUT=dir scripts/gpu_ci.sh                  # installs the package, then: python scripts/gpu_ci.py run dir
    python scripts/gpu_ci.py run OUT [--budget S] [--standin] [--fail STAGE]
    python scripts/gpu_ci.py record OUT        # a run's result into the tree (below)

``run`` runs five stages and exits non-zero when any fails (or runs past the budget):

- ``readme``: the README's test command, ``CI=true pytest -n auto``, with the GPU visible;
- ``gpu``: ``pytest -m gpu`` with a worker per core (the kernels' tests compile for minutes: with
  fewer workers it does not fit), idle workers stealing queued tests, and a fixed Hypothesis seed (``GPU_CI_SEED``, default 0);
- ``engine``: the engine tier on CUDA for infer_ref's Engine in bfloat16 (``infer-ref conformance
  --engine infer_ref``), one process on four threads, beside ``pytest -m gpu`` (it would not fit
  after it); the README's command runs alone before both (its workers take every core: beside it,
  the engine tier's oracle threads slowed both, 392 s and 476 s instead of 121 s and 193 s alone);
- ``golden``: ``infer-ref golden verify`` of the CUDA golden files on CUDA, after the engine tier;
- ``bench``: the benchmark gate ``pytest -m benchmark tests/benchmarks``, alone (timings), saved
  with ``--benchmark-save`` and compared with ``--benchmark-compare`` against the committed
  baseline of this machine id (``benchmarks/baselines/``) when there is one.

Each stage's time is printed as it ends; a one-screen summary at the end. Into OUT (five files):
``gpu-ci.json`` (tree, GPU, versions, each stage's command, time, exit status and test counts, the
slowest tests of the README command and of ``pytest -m gpu``; rewritten as each stage ends, so a run cut short leaves what it did),
``summary.txt``, ``log.txt`` (every stage's output), ``gpu-junit.xml`` (``pytest -m gpu``'s
per-test times) and ``benchmark.json`` (the saved benchmark run).

``--standin`` runs the same plumbing with a stand-in for each stage's command (a CPU machine
rehearses the summary, the result file, the exit status and ``record``); ``--fail STAGE`` makes
that stand-in fail. ``record OUT`` copies OUT's result to ``benchmarks/log/gpu_ci.json``, its
benchmark run (when the gate passed) to ``benchmarks/baselines/<machine id>/0001_gpu-ci.json``, and
regenerates CONTRIBUTING.md's block from the result (``scripts/contributing_figures.py gpu``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from contributing_figures import read_tests  # beside this script

ROOT = Path(__file__).resolve().parent.parent
RESULT = "gpu-ci.json"
RECORDED = ROOT / "benchmarks" / "log" / "gpu_ci.json"
BASELINES = ROOT / "benchmarks" / "baselines"
BASELINE_NAME = "0001_gpu-ci.json"
# The one command limit of the GPU host is 600 s, the package's install included: the stages get
# what is left of it less a margin.
DEFAULT_BUDGET_S = 560
SLOWEST = 15
STAGE_ORDER = ("readme", "gpu", "engine", "golden", "bench")
VERSIONS = ("torch", "transformers", "triton", "pytest", "pytest-xdist", "pytest-benchmark", "hypothesis",
            "numpy", "safetensors", "tokenizers")  # fmt: skip


@dataclass
class Stage:
    key: str
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    junit: Path | None = None  # where its pytest writes JUnit XML (counts, per-test times)
    counts_from: Callable[[], dict[str, int]] | None = None  # counts read another way
    note: str = ""
    cwd: Path = ROOT


@dataclass
class Outcome:
    key: str
    name: str
    command: str
    seconds: float
    exit_status: int
    counts: dict[str, int]
    note: str = ""
    slowest: list[tuple[float, str]] = field(default_factory=list)


def junit_counts(path: Path) -> tuple[dict[str, int], list[tuple[float, str]]]:
    """Counts by outcome and every case's (seconds, node id), slowest first, from JUnit XML (none
    where the stage wrote none)."""
    if not path.is_file():
        return {"passed": 0, "failed": 0, "skipped": 0}, []
    cases, counts = read_tests(path)
    return counts, cases


def golden_counts(path: Path) -> dict[str, int]:
    """Files verified and failed, from ``infer-ref golden verify --json``."""
    if not path.is_file():
        return {"passed": 0, "failed": 0, "skipped": 0}
    results = json.loads(path.read_text())
    failed = sum(1 for r in results if r["exit_code"] != 0)
    return {"passed": len(results) - failed, "failed": failed, "skipped": 0}


def machine_id() -> str:
    """pytest-benchmark's folder name for this machine's saved runs (``Linux-CPython-3.12-64bit``)."""
    from pytest_benchmark.utils import get_machine_id

    return str(get_machine_id())


def hypothesis_seed() -> str:
    """The seed of ``pytest -m gpu``'s Hypothesis draws: the same examples on every run of a tree, so a
    failure in the gate is reproduced by re-running it (with the seed, Hypothesis draws each test's
    examples from it alone, whichever worker runs the test). ``GPU_CI_SEED`` picks another seed: a
    search, not the gate."""
    seed = os.environ.get("GPU_CI_SEED", "0")
    if not seed.isdigit():
        raise SystemExit(f"error: GPU_CI_SEED must be a non-negative integer, got {seed!r}")
    return seed


def stages(work: Path, out: Path, standin: bool, fail: str | None) -> tuple[list[Stage], list[Stage], Stage]:
    """(the main lane: the README's command alone, then pytest -m gpu; the lane beside pytest -m gpu; the
    benchmark stage after both)."""
    py = sys.executable
    pytest_cmd = [py, "-m", "pytest", "-p", "no:cacheprovider"]
    cli = [py, "-m", "infer_ref.cli"]
    storage = work / "benchmarks"
    if BASELINES.is_dir():
        shutil.copytree(BASELINES, storage)
    baseline = sorted((storage / machine_id()).glob("*.json"))
    compare = ["--benchmark-compare"] if baseline else []
    golden_files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "golden").glob("*.cuda-bfloat16.json"))
    cpus = str(os.cpu_count() or 1)
    seed = hypothesis_seed()
    main = [
        Stage("readme", "the README's test command: CI=true pytest -n auto, GPU visible",
              [*pytest_cmd, "-n", "auto", "-q", f"--junitxml={work / 'readme.xml'}"],
              env={"CI": "true", "PYTEST_XDIST_AUTO_NUM_WORKERS": os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", cpus)},
              junit=work / "readme.xml"),
        # worksteal: the Triton compile tests take minutes each and sit together in one file; under the
        # default --dist load they queued behind each other (the stage ran well past its test time per
        # worker; the gpu-junit.xml of a run has both).
        Stage("gpu", f"pytest -m gpu -n {cpus} --dist worksteal --hypothesis-seed={seed}",
              [*pytest_cmd, "-m", "gpu", "-n", cpus, "--dist", "worksteal", "-q", f"--hypothesis-seed={seed}",
               f"--junitxml={out / 'gpu-junit.xml'}"],
              junit=out / "gpu-junit.xml"),
    ]  # fmt: skip
    beside = [
        Stage("engine", "engine tier: infer_ref's Engine on CUDA in bfloat16",
              [*cli, "conformance", "--engine", "infer_ref", "--dtype", "bfloat16", "--engine-option", "device=cuda",
               "--", f"--junitxml={work / 'engine.xml'}", "-q"],
              env={"OMP_NUM_THREADS": "4"},  # the oracle's float64 threads, beside pytest -m gpu's workers
              junit=work / "engine.xml", cwd=work),  # from outside the checkout, as an engine team runs it
        Stage("golden", f"golden verify of the {len(golden_files)} CUDA golden files on CUDA",
              [*cli, "golden", "verify", *golden_files, "--device", "cuda", "--json", str(work / "golden.json")],
              counts_from=lambda: golden_counts(work / "golden.json")),
    ]  # fmt: skip
    bench = Stage(
        "bench", "benchmark gate: pytest -m benchmark, saved and compared",
        [*pytest_cmd, "-m", "benchmark", "tests/benchmarks", "-q", f"--junitxml={work / 'bench.xml'}",
         f"--benchmark-storage=file://{storage}", "--benchmark-save=gpu-ci", *compare],
        junit=work / "bench.xml",
        note=(f"compared with {baseline[-1].relative_to(storage)}" if baseline
              else f"no committed baseline for {machine_id()}: this run's benchmark.json is the one to commit"),
    )  # fmt: skip
    if standin:
        for stage in [*main, *beside, bench]:
            stage.argv = [py, __file__, "standin", stage.key, str(stage.junit or work / "golden.json"),
                          "fail" if stage.key == fail else "pass"]  # fmt: skip
    return main, beside, bench


class Runner:
    """Runs stages against one deadline, each stage's output into a log of its own."""

    def __init__(self, work: Path, out: Path, deadline: float, info: dict[str, Any]) -> None:
        self.work, self.out, self.deadline, self.info = work, out, deadline, info
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.start = time.monotonic()

    def run(self, stage: Stage) -> Outcome:
        log = self.work / f"{stage.key}.log"
        left = self.deadline - time.monotonic()
        started = time.monotonic()
        print(f"=== stage: {stage.name}", flush=True)
        if left <= 0:
            status = 124
            log.write_text("not started: the budget was spent\n")
        else:
            with log.open("w") as fh:
                fh.write("$ " + " ".join(stage.argv) + "\n")
                fh.flush()
                proc = subprocess.Popen(stage.argv, cwd=stage.cwd, env={**os.environ, **stage.env}, stdout=fh,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
                try:
                    status = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    status = 124
                    fh.write(f"\n=== killed: past the run's budget ({left:.0f} s were left at its start)\n")
        seconds = time.monotonic() - started
        counts, slowest = junit_counts(stage.junit) if stage.junit else ({}, [])
        if stage.counts_from is not None:
            counts = stage.counts_from()
        outcome = Outcome(stage.key, stage.name, " ".join(stage.argv), round(seconds, 1), status, counts,
                          stage.note, slowest[:SLOWEST] if stage.key in ("readme", "gpu") else [])  # fmt: skip
        shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        print(f"=== stage done in {seconds:.0f} s: {stage.name} (exit status {status}{'; ' + shown if shown else ''})",
              flush=True)  # fmt: skip
        if status != 0:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(f"  | {line}" for line in tail), flush=True)
        with self.lock:
            self.outcomes.append(outcome)
            self.write(complete=False)
        return outcome

    def lane(self, lane: list[Stage]) -> None:
        for stage in lane:
            self.run(stage)

    def result(self, complete: bool) -> dict[str, Any]:
        ok = complete and all(o.exit_status == 0 for o in self.outcomes)
        done = sorted(self.outcomes, key=lambda o: STAGE_ORDER.index(o.key))
        return {**self.info, "complete": complete, "passed": ok, "total_s": round(time.monotonic() - self.start, 1),
                "stages": [o.__dict__ for o in done]}  # fmt: skip

    def write(self, complete: bool) -> None:
        """gpu-ci.json and log.txt as they stand (a run cut short still leaves them)."""
        tmp = self.out / f".{RESULT}.tmp"
        tmp.write_text(json.dumps(self.result(complete), indent=1) + "\n")
        tmp.replace(self.out / RESULT)
        with (self.out / "log.txt").open("w") as log:
            for o in self.outcomes:
                log.write(f"\n===== {o.name}: exit status {o.exit_status}, {o.seconds:.0f} s\n")
                log.write((self.work / f"{o.key}.log").read_text(errors="replace"))


def environment(standin: bool) -> dict[str, Any]:
    """The tree, the GPU, the CPUs and the versions the run ran on."""
    probe = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    gpu = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False).stdout.strip()
    try:  # a copy of the tree may come without .git, a machine without git
        tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip
    except FileNotFoundError:
        tree = ""
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "mode": "standin" if standin else "gpu",
        "tree": os.environ.get("GPU_CI_TREE") or tree or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu or None,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
        "benchmark_machine_id": machine_id(),
        "hypothesis_seed": int(hypothesis_seed()),
    }


def summary(result: dict[str, Any], budget: float) -> str:
    v = result["versions"]
    lines = [
        f"GPU CI ({result['mode']}) at {result['tree']}, {result['date']}: {result['gpu'] or 'no GPU'}, "
        f"{result['cpus']} CPUs; python {result['python']}, torch {v['torch']}, transformers {v['transformers']}",
        "",
        f"{'stage':<62} {'s':>5} {'exit':>4} {'passed':>6} {'failed':>6} {'skipped':>7}",
    ]
    for s in result["stages"]:
        c = s["counts"]
        lines.append(f"{s['name'][:62]:<62} {s['seconds']:>5.0f} {s['exit_status']:>4} "
                     f"{c.get('passed', ''):>6} {c.get('failed', ''):>6} {c.get('skipped', ''):>7}")  # fmt: skip
    notes = [f"{s['key']}: {s['note']}" for s in result["stages"] if s["note"]]
    verdict = "PASSED" if result["passed"] else "FAILED"
    return "\n".join([*lines, *notes, "", f"{verdict} in {result['total_s']:.0f} s (budget {budget:.0f} s)"])


def run(out: Path, budget: float, standin: bool, fail: str | None, install_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    info = {**environment(standin), "budget_s": budget, "install_s": install_s}
    if not standin and not info["gpu"]:
        print("error: no CUDA device visible: the GPU CI runs on a GPU machine (--standin rehearses it on a CPU)",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-ci-") as tmp:
        work = Path(tmp)
        main, beside, bench = stages(work, out, standin, fail)
        runner = Runner(work, out, time.monotonic() + budget, info)
        readme, after_readme = main[0], main[1:]
        runner.run(readme)  # alone: its workers take every core
        side = threading.Thread(target=runner.lane, args=(beside,))
        side.start()
        runner.lane(after_readme)
        side.join()
        runner.run(bench)
        saved = sorted((work / "benchmarks").glob("*/*_gpu-ci.json"))
        if saved:
            shutil.copyfile(saved[-1], out / "benchmark.json")
        result = runner.result(complete=True)
        runner.write(complete=True)
    text = summary(result, budget)
    (out / "summary.txt").write_text(text + "\n")
    print("\n" + text)
    return 0 if result["passed"] else 1


def standin(key: str, target: Path, outcome: str) -> int:
    """A stage's stand-in: what its command leaves (JUnit XML, golden JSON, a saved benchmark)."""
    failed = outcome == "fail"
    if target.suffix == ".json":
        target.write_text(json.dumps([{"file": "standin.json", "impl": "infer_ref", "exit_code": int(failed)}]))
    else:
        failure = "<failure message='planted'/>" if failed else ""
        target.write_text(f"<testsuites><testsuite><testcase classname='tests.standin' name='test_{key}' time='0.5'>"
                          f"{failure}</testcase><testcase classname='tests.standin' name='test_skip' time='0'>"
                          "<skipped/></testcase></testsuite></testsuites>")  # fmt: skip
    if key == "bench":
        storage = target.parent / "benchmarks" / machine_id()
        storage.mkdir(parents=True, exist_ok=True)
        (storage / "0002_gpu-ci.json").write_text(json.dumps({"machine_info": {}, "benchmarks": []}))
    print(f"stand-in for {key}: {outcome}")
    return int(failed)


def record(folder: Path) -> None:
    result = json.loads((folder / RESULT).read_text())
    if result["mode"] != "gpu":
        raise SystemExit(f"{folder / RESULT}: a {result['mode']} run: only a run on a GPU is recorded")
    RECORDED.write_text(json.dumps(result, indent=1) + "\n")
    print(f"result: {RECORDED.relative_to(ROOT)}")
    bench = next((s for s in result["stages"] if s["key"] == "bench"), None)
    if bench is not None and bench["exit_status"] == 0 and (folder / "benchmark.json").is_file():
        target = BASELINES / result["benchmark_machine_id"] / BASELINE_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "benchmark.json", target)
        print(f"baseline: {target.relative_to(ROOT)}")
    subprocess.run([sys.executable, "scripts/contributing_figures.py", "gpu", str(RECORDED.relative_to(ROOT)),
                    "--write", "CONTRIBUTING.md"], cwd=ROOT, check=True)  # fmt: skip
    print("CONTRIBUTING.md regenerated")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the stages; results into OUT")
    r.add_argument("out", type=Path)
    r.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all stages together")
    r.add_argument("--install-seconds", type=float, default=0.0, help="the install's time, for the record")
    r.add_argument("--standin", action="store_true", help="stand-ins for the stages' commands (a CPU rehearsal)")
    r.add_argument("--fail", choices=STAGE_ORDER, help="with --standin: this stage fails")
    s = sub.add_parser("standin", help=argparse.SUPPRESS)
    s.add_argument("key")
    s.add_argument("target", type=Path)
    s.add_argument("outcome", choices=["pass", "fail"])
    c = sub.add_parser("record", help="a GPU run's result into benchmarks/log, the baseline and CONTRIBUTING.md")
    c.add_argument("folder", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        if args.fail and not args.standin:
            parser.error("--fail plants a failing stand-in: it needs --standin")
        return run(args.out, args.budget, args.standin, args.fail, args.install_seconds)
    if args.command == "standin":
        return standin(args.key, args.target, args.outcome)
    record(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
