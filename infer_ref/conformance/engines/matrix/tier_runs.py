"""Run mode: the engine tier once per engine, each writing its JUnit XML and report JSON into one
folder, with the engine's expected failures; an engine whose venv is missing is left out, in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.registry import RECORDS, EngineRecord
from infer_ref.errors import UsageError

XFAILS_DIR = Path(__file__).resolve().parents[2] / "xfails"


@dataclass(frozen=True)
class EngineRun:
    """How the matrix runs one engine of the tier's registry (its record), in one dtype."""

    xfails: str | None = None  # its file in infer_ref/conformance/xfails
    python_env: str | None = None  # the variable naming its venv's interpreter (None: runs in this Python)
    module: str | None = None  # what that interpreter imports
    install: str | None = None  # the script that makes its venv
    engine: str | None = None  # the tier's name for the engine, where the column's name differs
    dtype: str | None = None  # --dtype, where not the tier's float32


def matrix_runs(records: Sequence[EngineRecord] = RECORDS) -> dict[str, EngineRun]:
    """The matrix's columns, from the registry: each engine in it, then (after the engines that
    share its venv) the engine in each of its further dtypes (``llama.cpp-float16``)."""
    runs: dict[str, EngineRun] = {}
    shown = [r for r in records if r.in_matrix]
    for i, r in enumerate(shown):
        runs[r.name] = EngineRun(r.xfails, r.python_env, r.module, r.install)
        family_ends = i + 1 == len(shown) or r.python_env is None or shown[i + 1].python_env != r.python_env
        if family_ends:
            for base in (b for b in shown if b.python_env == r.python_env and b.python_env is not None):
                for dtype in base.matrix_dtypes:
                    runs[f"{base.name}-{dtype}"] = EngineRun(
                        base.xfails, base.python_env, base.module, base.install, engine=base.name, dtype=dtype
                    )
    return runs


RUNS = matrix_runs()

Runner = Callable[[Sequence[str], Path], int]  # (command line, log file) -> exit status


def check_engines(engines: Sequence[str]) -> None:
    unknown = [e for e in engines if e not in RUNS]
    if unknown:
        raise UsageError(
            f"--engines {' '.join(unknown)}: not an engine the matrix runs; expected some of "
            f"{', '.join(RUNS)}"
        )


def missing_venv(engine: str) -> str | None:
    """Why ``engine`` cannot run here (one line), or None when its interpreter is there."""
    spec = RUNS[engine]
    if spec.python_env is None or spec.module is None:
        return None
    python = os.environ.get(spec.python_env)
    how = f"`bash {spec.install} DIR`, then `export {spec.python_env}=DIR/bin/python`"
    if python:
        return (
            None
            if Path(python).is_file()
            else f"{engine}: left out: ${spec.python_env} names {python}, which does not exist ({how})"
        )
    if importlib.util.find_spec(spec.module) is None:
        unset = f"${spec.python_env} is unset and this Python has no {spec.module}"
        return f"{engine}: left out: no venv ({unset}; {how})"
    return None


LONG_CONTEXT_DIR = "long"  # the long-context workload's results: OUT/long/E.xml beside OUT/E.xml


def tier_command(
    engine: str, out: Path, model_dirs: Sequence[Path] = (), *, long_context: bool = False
) -> list[str]:
    """``infer-ref conformance --engine E [--xfails F] [--long-context] --report OUT/E.json --
    --junitxml=OUT/E.xml``
    (``out`` is then the long-context folder)."""
    spec = RUNS[engine]
    command = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", spec.engine or engine]
    if long_context:
        command.append("--long-context")
    if spec.dtype:
        command += ["--dtype", spec.dtype]
    xfails = long_context_xfails(spec.xfails) if long_context else spec.xfails
    if xfails:
        command += ["--xfails", str(XFAILS_DIR / xfails)]
    for folder in model_dirs:
        command += ["--model-dir", str(folder)]
    return [
        *command,
        "--report",
        str(out / f"{engine}.json"),
        "--",
        f"--junitxml={out / f'{engine}.xml'}",
        "-q",
    ]


def long_context_xfails(default: str | None) -> str | None:
    """The long-context workload's expected failures of an engine: ``NAME-long.txt`` beside its
    default file, where there is one (the default file's entries name tests that run would not
    collect: stale, they would fail it)."""
    if default is None:
        return None
    name = default.removesuffix(".txt") + "-long.txt"
    return name if (XFAILS_DIR / name).is_file() else None


def run_with_log(command: Sequence[str], log: Path) -> int:
    with log.open("w") as handle:
        return subprocess.run(list(command), stdout=handle, stderr=subprocess.STDOUT, check=False).returncode


def run_engines(
    engines: Sequence[str],
    out: Path,
    model_dirs: Sequence[Path] = (),
    runner: Runner = run_with_log,
    say: Callable[[str], None] = print,
    *,
    long_context: bool = False,
) -> dict[str, int]:
    """Run the tier (``long_context``: the long-context workload, into ``out/long``) on each engine
    that can run here: the engines whose results are in ``out``, with their tiers' exit statuses."""
    check_engines(engines)
    if long_context:
        out = out / LONG_CONTEXT_DIR
    out.mkdir(parents=True, exist_ok=True)
    ran: dict[str, int] = {}
    for engine in engines:
        why_not = missing_venv(engine)
        if why_not is not None:
            say(why_not)
            continue
        start = time.monotonic()
        status = runner(
            tier_command(engine, out, model_dirs, long_context=long_context), out / f"{engine}.log"
        )
        seconds = time.monotonic() - start
        if not (out / f"{engine}.xml").is_file():
            say(
                f"{engine}: left out: the tier wrote no results (exit status {status}; see "
                f"{out / f'{engine}.log'})"
            )
            continue
        say(
            f"{engine}: ran in {seconds:.0f} s, {_verdict(status, out / f'{engine}.json')} (log: "
            f"{out / f'{engine}.log'})"
        )
        ran[engine] = status
    return ran


def _verdict(status: int, report: Path) -> str:
    """What the exit status meant, from the run's report where it wrote one."""
    if status == 0:
        return "no unexpected failure"
    try:
        written = json.loads(report.read_text())
        failed, stale = int(written["totals"]["counts"]["failed"]), len(written["stale_xfails"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"exit status {status}"
    # stale entries are expected when --model-dir leaves out checkpoints the xfails file names
    return f"exit status {status}: {failed} failed, {stale} stale xfail entries"
