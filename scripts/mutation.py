"""Mutation testing of the reference core and of the kit's checkers, with mutmut 3 (docs/mutation.md).

    python scripts/mutation.py run [--part P ...] [--slice K] [--jobs 2]
                                                               mutate and test, part by part, slice by slice
    python scripts/mutation.py run --whole --jobs 30           every mutant in one mutmut run (many cores)
    python scripts/mutation.py figures [--modules] [--json F]  the table per part (and module), from mutants/;
                                                               --json: the run's record (docs/mutation.md's tables)
    python scripts/mutation.py survivors [--part P]            survivors not listed as equivalent
    python scripts/mutation.py check --floor F [--endings 7]   CI's bounded check (a fixed sample)

mutmut reads its settings from ``[tool.mutmut]`` in pyproject.toml (the files it mutates, the tests
it may run) and keeps its state in ``mutants/``: a second ``run`` retests only what changed.
Install it with ``pip install -e '.[mutation]'``. Run from the repository root.

A part is a set of mutmut mutant-name globs, run in slices: slice K of N holds the mutants whose number
is K modulo N, so every function's mutants are spread evenly over the slices and a slice needs no earlier
run to be named. SLICES gives each part enough slices for one to finish within an hour on 2 cores
(each slice prints its time). The
equivalent mutants (no test can tell them from the original) are listed with their reasons in
scripts/mutation_equivalent.txt: they count neither as killed nor as survived.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.txt"

# Part name -> mutant-name globs (mutmut names a mutant module.function__mutmut_N).
PARTS: dict[str, list[str]] = {
    # The paged caches and their pool are half of the caches' mutants: a part of their own.
    "cache-paged": [f"infer_ref.cache.{m}.*" for m in ("paged", "static_paged", "pool", "slots", "storage")],
    "cache": [f"infer_ref.cache.{m}.*" for m in (
        "base", "contiguous", "dynamic", "static", "position", "factory", "snapshot", "geometry", "windows",
        "device_positioned", "protocol", "errors")],
    "engine": ["infer_ref.engine.*", "infer_ref.sampling.*", "infer_ref.results.*"],
    "attention": ["infer_ref.attention.*", "infer_ref.masks.*", "infer_ref.rotary.*"],
    "checkers": ["infer_ref.conformance.*"],
}

# How many slices each part runs in, so that one slice finishes within an hour on 2 cores (chosen from
# the per-mutant times of a full run; each slice prints its time). A slice is a residue of the mutant's
# number mod N.
SLICES: dict[str, int] = {"cache-paged": 2, "cache": 1, "engine": 1, "attention": 1, "checkers": 1}

# mutmut's exit codes, grouped into the columns of docs/mutation.md. Anything else (a crash of the
# test process that is not a test failure) is "suspicious" and shown on its own.
KILLED_CODES = {1, 3, 37}  # a test failed; pytest's internal error; caught by the type checker
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}  # no selected test reaches the mutated function: a survivor too
TIMEOUT_CODES = {24, -24, 36, 152, 255}
NOT_RUN_CODES = {None, 2, 34}


def _mutmut_env() -> dict[str, str]:
    # One thread per test process: mutmut runs --jobs of them side by side.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("CI", "true")  # the derandomized Hypothesis profile: a verdict is reproducible
    return env


def _run_mutmut(names: list[str], jobs: int) -> None:
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names]
    done = subprocess.run(cmd, cwd=ROOT, env=_mutmut_env())
    # mutmut exits non-zero when survivors remain; a missing results folder is the real failure.
    if not (ROOT / "mutants").is_dir():
        raise SystemExit(f"mutmut produced no mutants/ folder (exit {done.returncode}): see its output above")


def results() -> dict[str, int | None]:
    """Every mutant mutmut generated -> the exit code of its test run (None: not run yet)."""
    out: dict[str, int | None] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def equivalent() -> dict[str, str]:
    """Mutant name -> why it is equivalent, from scripts/mutation_equivalent.txt (``name  reason``)."""
    out: dict[str, str] = {}
    for line in EQUIVALENT_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            if not reason.strip():
                raise SystemExit(f"{EQUIVALENT_FILE.name}: {name} has no reason; each line is 'name  reason'")
            out[name] = reason.strip()
    return out


def part_of(name: str) -> str | None:
    return next((part for part, globs in PARTS.items() if any(fnmatch(name, g) for g in globs)), None)


def status(code: int | None, name: str, equivalents: dict[str, str]) -> str:
    if code in KILLED_CODES:
        return "killed"
    if name in equivalents:
        return "equivalent"
    if code in SURVIVED_CODES or code in NO_TESTS_CODES:
        return "survived" if code in SURVIVED_CODES else "no tests"
    if code in TIMEOUT_CODES:
        return "timed out"
    if code in NOT_RUN_CODES:
        return "not run"
    return "suspicious"


COLUMNS = ["generated", "killed", "survived", "no tests", "timed out", "equivalent", "suspicious", "not run"]


def figures(only: list[str] | None = None, by_module: bool = False) -> dict[str, Counter[str]]:
    """Part (or module) -> counts per column. The score is killed / (generated - equivalent - not run)."""
    equivalents = equivalent()
    table: dict[str, Counter[str]] = {}
    for name, code in results().items():
        part = part_of(name)
        if part is None or (only and part not in only):
            continue
        # A mutant's name is module.function__mutmut_N; a method's function part starts with "xǁ".
        key = name.split("__mutmut_")[0].rsplit(".", 1)[0] if by_module else part
        row = table.setdefault(key, Counter())
        row["generated"] += 1
        row[status(code, name, equivalents)] += 1
    return table


def score(row: Counter[str]) -> float:
    judged = row["generated"] - row["equivalent"] - row["not run"]
    # A timeout counts as killed: the mutant made a test hang, which a run notices.
    return (row["killed"] + row["timed out"]) / judged if judged else float("nan")


def percent(fraction: float) -> str:
    """One decimal, rounded down: a score short of 100% never prints as 100.0%."""
    return f"{math.floor(fraction * 1000) / 10:.1f}%" if fraction == fraction else "n/a"


def markdown(table: dict[str, Counter[str]], by_module: bool = False) -> str:
    """The table docs/mutation.md shows: one row per part (or module, sorted) and a total row."""
    lines = [f"| {'module' if by_module else 'part'} | " + " | ".join(COLUMNS) + " | score |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    keys = sorted(table) if by_module else [part for part in PARTS if part in table]
    for key in keys:
        row = table[key]
        name = f"`{key}`" if by_module else key
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in COLUMNS) + f" | {percent(score(row))} |")
    total = sum(table.values(), Counter())
    lines.append("| **all** | " + " | ".join(f"**{total[c]}**" for c in COLUMNS) + f" | **{percent(score(total))}** |")
    return "\n".join(lines)


def survivors(only: list[str] | None = None) -> list[str]:
    equivalents = equivalent()
    return [name for name, code in results().items()
            if (part := part_of(name)) and (not only or part in only)
            and status(code, name, equivalents) in ("survived", "no tests", "suspicious")]


def slice_globs(part: str, index: int, count: int) -> list[str]:
    """Slice ``index`` (0-based) of ``count``: the part's mutants whose number is ``index`` modulo ``count``.
    Written as globs on the number's last digit (count must divide 10), so mutmut needs no earlier run."""
    if count not in (1, 2, 5, 10) or not 0 <= index < count:
        raise SystemExit(f"slice {index + 1} of {count}: the count must be 1, 2, 5 or 10 and the slice 1..count")
    if count == 1:
        return list(PARTS[part])
    return [f"{glob}__mutmut_*{digit}" for glob in PARTS[part] for digit in range(index, 10, count)]


def sample_globs(parts: list[str], endings: str) -> list[str]:
    """A fixed sample of the parts' mutants: those whose number ends in one of ``endings`` (``"7"``:
    one in ten, evenly spread over every function). Globs, so mutmut needs no earlier run to list them."""
    return [f"{glob}__mutmut_*{digit}" for part in parts for glob in PARTS[part] for digit in endings]


def cmd_run(args: argparse.Namespace) -> int:
    if args.whole:
        # One mutmut run over every part: one trace and one clean pass instead of one per slice, which
        # pays on a machine with many cores (the slices exist to fit 2 cores' hour).
        if args.part or args.slice:
            raise SystemExit("--whole runs every part at once: give it without --part and --slice")
        start = time.monotonic()
        _run_mutmut([glob for globs in PARTS.values() for glob in globs], args.jobs)
        print(f"every part, one run on {args.jobs} workers: {time.monotonic() - start:.0f} s", flush=True)
        print(markdown(figures()))
        return 0
    for part in args.part or list(PARTS):
        count = SLICES[part]
        if args.slice is not None and not 1 <= args.slice <= count:
            raise SystemExit(f"--slice {args.slice}: part {part} has slices 1..{count}")
        for index in [args.slice - 1] if args.slice else range(count):
            start = time.monotonic()
            _run_mutmut(slice_globs(part, index, count), args.jobs)
            print(f"part {part}, slice {index + 1} of {count}: {time.monotonic() - start:.0f} s", flush=True)
    print(markdown(figures(args.part)))
    return 0


def record(parts: dict[str, Counter[str]], modules: dict[str, Counter[str]]) -> dict:
    """The run's record (``figures --json F``; committed as benchmarks/log/mutation.json, docs/mutation.md's
    tables are generated from it by scripts/doc_figures.py): the tree mutated, the day, the counts per part
    and per module."""
    tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "tree": tree.stdout.strip() or "unknown",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "parts": {part: dict(row) for part, row in parts.items()},
        "modules": {module: dict(row) for module, row in modules.items()},
    }


def cmd_figures(args: argparse.Namespace) -> int:
    table = figures()
    print(markdown(table))
    modules = figures(by_module=True) if args.modules or args.json else {}
    if args.modules:
        print()
        print(markdown(modules, by_module=True))
    if args.json:
        Path(args.json).write_text(json.dumps(record(table, modules), indent=2) + "\n")
    return 0


def cmd_survivors(args: argparse.Namespace) -> int:
    for name in survivors(args.part):
        print(name)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    parts = args.part or list(PARTS)
    globs = sample_globs(parts, args.endings)
    start = time.monotonic()
    _run_mutmut(globs, args.jobs)
    equivalents = equivalent()
    chosen = {n: c for n, c in results().items() if any(fnmatch(n, g) for g in globs)}
    statuses = {n: status(c, n, equivalents) for n, c in chosen.items()}
    counts = Counter(statuses.values()) + Counter(generated=len(chosen))
    kill_rate = score(counts)
    print(
        f"mutation check: {len(chosen)} mutants of {', '.join(parts)} (numbers ending in {args.endings}) in "
        f"{time.monotonic() - start:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; score {kill_rate:.1%} (floor {args.floor:.1%})"
    )
    for name, verdict in sorted(statuses.items()):
        if verdict in ("survived", "no tests", "suspicious", "not run"):
            print(f"  {verdict}: {name}  (python -m mutmut show {name})")
    return 0 if kill_rate >= args.floor else 1  # NaN (nothing judged) fails too


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="mutate and test, part by part")
    run.add_argument("--part", action="append", choices=list(PARTS))
    run.add_argument("--slice", type=int, help="run only this slice (1..N) of each part named (SLICES gives N)")
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--whole", action="store_true", help="every part in one mutmut run (for many cores)")
    fig = sub.add_parser("figures", help="the table per part from mutants/")
    fig.add_argument("--json")
    fig.add_argument("--modules", action="store_true", help="the table per module too")
    surv = sub.add_parser("survivors", help="survivors not listed as equivalent")
    surv.add_argument("--part", action="append", choices=list(PARTS))
    check = sub.add_parser("check", help="CI's bounded check: a fixed sample with a floor on the score")
    check.add_argument("--part", action="append", choices=list(PARTS))
    check.add_argument("--endings", default="7", help="sample the mutants whose number ends in these digits")
    check.add_argument("--floor", type=float, required=True)
    check.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    return {"run": cmd_run, "figures": cmd_figures, "survivors": cmd_survivors, "check": cmd_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
