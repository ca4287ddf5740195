"""What the engine tier catches in each dtype: ``python -m infer_ref.conformance.engines.power``.

Every planted engine bug — the schedule and API-layer bugs of
:mod:`~infer_ref.conformance.engines.mutants` and the kit's bug classes planted inside infer_ref's
Engine (:mod:`~infer_ref.conformance.engines.kit_bugs`) — and the unbroken Engine (the control) run
the whole engine tier on every kit checkpoint in float32, bfloat16 and float16, one pytest process
each (``--jobs`` at a time). A mutant is *caught* in a dtype when a tier test fails on it; the
control must fail nothing in any dtype (a failure there is a false alarm). Written: the power block
of docs/low-precision.md (caught in float32 / bfloat16 / float16, the tests that failed, and for a
bug a dtype misses, its largest distribution statistic against the threshold and its largest
recipe deviation in calibrated spreads) and a JSON of the runs (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.kit_bugs import KIT_BUG_MUTANTS
from infer_ref.conformance.engines.mutants import ENGINE_MUTANTS, PLANTED_DTYPES, PlantedBug
from infer_ref.conformance.engines.verdicts.thresholds import JUDGED
from infer_ref.fileio import replace_between_markers

COMMAND = "python -m infer_ref.conformance.engines.power"
DOC = Path(__file__).resolve().parents[3] / "docs" / "low-precision.md"
DTYPES = PLANTED_DTYPES
CONTROL = "infer_ref"


@dataclass(frozen=True)
class Planted:
    """A row of the table: a planted bug (its module's ``--engine`` attribute), or the control (no bug)."""

    module: str
    bug: PlantedBug | None = None

    @property
    def name(self) -> str:  # the --engine spec's attribute
        return self.bug.name if self.bug else CONTROL

    @property
    def bug_class(self) -> str:
        return self.bug.bug_class if self.bug else "none (the control)"

    @property
    def bug_in(self) -> tuple[str, ...]:  # elsewhere the planted change is a correct recipe: "—" in the table
        return self.bug.bug_in if self.bug else DTYPES

    @property
    def no_bug_because(self) -> str:
        return self.bug.no_bug_because if self.bug else ""

    @property
    def engine(self) -> str:
        return f"{self.module}:{self.name}" if self.bug else self.name


PLANTED = (
    Planted(""),
    *(
        Planted(module, m)
        for module, mutants in (
            ("infer_ref.conformance.engines.mutants", ENGINE_MUTANTS),
            ("infer_ref.conformance.engines.kit_bugs", KIT_BUG_MUTANTS),
        )
        for m in mutants
    ),
)


def run_tier(planted: Planted, dtype: str, workdir: Path) -> dict:
    """The whole engine tier on ``planted`` in ``dtype``: the tests that failed and the distribution rows."""
    report = workdir / f"{planted.name}-{dtype}.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        "0",
        "-rf",
        "--pyargs",
        "infer_ref.conformance.engines.tests",
        f"--ir-engine={planted.engine}",
        f"--ir-engine-dtype={dtype}",
        f"--ir-report={report}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    failed = sorted(
        {
            line.split(" ", 1)[1].split(" - ", 1)[0].split("::")[-1]
            for line in done.stdout.splitlines()
            if line.startswith("FAILED ")
        }
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(
            f"{planted.engine} in {dtype}: pytest exit status "
            f"{done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        )
    distributions = json.loads(report.read_text()).get("distributions", []) if report.exists() else []
    return {
        "engine": planted.name,
        "bug_class": planted.bug_class,
        "dtype": dtype,
        "failed": failed,
        "distributions": distributions,
    }


def closest_miss(run: dict) -> str:
    """For a run that caught nothing: the distribution statistic nearest its threshold (value /
    threshold) and, where the recipe verdict judged the run, its largest deviation in spreads."""
    recipe = largest_recipe_deviation(run)
    return nearest_threshold(run) + (f"; {recipe}" if recipe else "")


def largest_recipe_deviation(run: dict) -> str:
    """The recipe statistic furthest from the legitimate recipes' centre, in calibrated spreads (a
    catch needs 3 spreads and |t| > 5: signed_statistics), or "" when no recipe row was judged."""
    best: tuple[float, str] | None = None
    for row in run["distributions"]:
        for name, stat in (row.get("recipe_statistics") or {}).items():
            if not stat.get("judged"):
                continue
            size = abs(stat["spreads"])
            if best is None or size > best[0]:
                text = f"recipe {name} {stat['spreads']:+.1f} spreads (t {stat['t']:+.1f}) on {row['checkpoint']}"
                best = (size, text)
    return best[1] if best else ""


def nearest_threshold(run: dict) -> str:
    """The distribution statistic nearest its threshold, as value = ratio x its threshold."""
    best: tuple[float, str] | None = None
    for row in run["distributions"]:
        for name in JUDGED:
            if name not in row["thresholds"]:
                continue  # a row judged otherwise (the recipe statistics: their spreads are in their failure)
            value, threshold = row[name], row["thresholds"][name]
            ratio = (
                (1 - value) / max(1e-12, 1 - threshold)
                if name == "same_top"
                else value / max(threshold, 1e-300)
            )
            if best is None or ratio > best[0]:
                best = (ratio, f"{name} {value:.3g} = {ratio:.2f} x its threshold on {row['checkpoint']}")
    return best[1] if best else "no distribution judged"


def merged(run_lists: list[list[dict]]) -> list[dict]:
    """One run per (bug, dtype): a later list's run stands over an earlier one's; order kept."""
    by: dict[tuple[str, str], dict] = {}
    for runs in run_lists:
        for run in runs:
            by.pop((run["engine"], run["dtype"]), None)
            by[(run["engine"], run["dtype"])] = run
    return list(by.values())


def markdown(runs: list[dict]) -> str:
    by = {(r["engine"], r["dtype"]): r for r in runs}
    lines = [
        f"Generated by `{COMMAND}`: the whole engine tier, every kit checkpoint, per dtype. ✔ caught (the "
        "tests that failed), "
        "✘ missed (in low precision: the statistic nearest its threshold, and the recipe statistic "
        "furthest from the legitimate recipes' centre, in calibrated spreads, where the recipe verdict "
        "judged the run; a catch needs 3 spreads and |t| > 5).",
        "",
        "| planted bug | bug class | float32 | bfloat16 | float16 |",
        "|---|---|---|---|---|",
    ]
    for p in PLANTED:
        cells = []
        for dtype in DTYPES:
            run = by.get((p.name, dtype))
            if run is None:
                cells.append("not run")
            elif p.bug is None or dtype not in p.bug_in:  # nothing to catch: the control, or a correct recipe
                quiet = "no false alarm" if p.bug is None else "—"  # "—": why, under the table
                cells.append(quiet if not run["failed"] else "**false alarm**: " + ", ".join(run["failed"]))
            elif run["failed"]:
                cells.append(
                    "✔ " + ", ".join(sorted({t.split("[")[0].removeprefix("test_") for t in run["failed"]}))
                )
            else:
                cells.append("✘" + (f" ({closest_miss(run)})" if dtype != "float32" else ""))
        lines.append(f"| {p.name} | {p.bug_class} | " + " | ".join(cells) + " |")
    lines += ["", "— the planted change is no bug in that dtype:", ""]
    lines += [f"- {p.name}: {p.no_bug_because}." for p in PLANTED if p.no_bug_because]
    missed = [
        f"{p.name} in {d}"
        for p in PLANTED[1:]
        for d in p.bug_in
        if (p.name, d) in by and not by[(p.name, d)]["failed"]
    ]
    caught = {d: {p.name for p in PLANTED[1:] if by.get((p.name, d), {}).get("failed")} for d in DTYPES}
    base = caught["float32"]
    lines.append("")
    for dtype in DTYPES[1:]:
        share = len(caught[dtype] & base) / len(base) if base else 1.0
        extra = sorted(caught[dtype] - base)
        lines.append(
            f"- {dtype}: catches {len(caught[dtype] & base)} of the {len(base)} bugs float32 catches "
            f"({share:.0%})"
            + (f", and {len(extra)} float32 cannot see ({', '.join(extra)})" if extra else "")
            + "."
        )
    lines.append(f"- missed where it is a bug: {', '.join(missed) or 'none'}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="pytest processes at once"
    )
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="default: all three")
    parser.add_argument("--only", action="append", help="planted bug names (default: all, and the control)")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    parser.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="a --json of an earlier run: its runs stand where this one does not redo them",
    )
    parser.add_argument(
        "--from-runs",
        type=Path,
        action="append",
        default=None,
        help="run nothing: the block from these --json files (a later file's run of the same bug and "
        "dtype stands over an earlier one's)",
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the page whose power block is rewritten")
    args = parser.parse_args(argv)
    if args.from_runs:
        runs = merged([json.loads(path.read_text()) for path in args.from_runs])
        replace_between_markers(args.doc, "power", markdown(runs))
        print(f"wrote the power block of {args.doc} from {len(runs)} runs")
        return 0
    chosen = [p for p in PLANTED if not args.only or p.name in args.only]
    jobs = [(p, d) for p in chosen for d in (args.dtype or DTYPES)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(lambda job: run_tier(job[0], job[1], Path(tmp)), jobs))
    if args.merge:
        runs = merged([json.loads(args.merge.read_text()), runs])
    for run in runs:
        print(
            f"{run['engine']} {run['dtype']}: " + (", ".join(run["failed"]) or "nothing failed"), flush=True
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    if args.merge or (not args.only and not args.dtype):
        replace_between_markers(args.doc, "power", markdown(runs))
        print(f"wrote the power block of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
