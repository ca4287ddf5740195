"""Run the property suite against every planted bug; fail unless each one is caught.

    python -m infer_ref.conformance.mutants [--jobs N] [--only NAME ...] [--tiers default|all] [--write-table docs/conformance.md]

Each mutant runs in its own ``pytest`` subprocess (``--ir-impl=infer_ref.conformance.mutants:NAME``)
over the test files relevant to it, under the ``mutants`` Hypothesis profile (``ci``'s
derandomized examples without shrinking: same verdict, sooner). A mutant is *caught* when at
least one test fails; a run that cannot even start (usage or collection error) counts as not
caught. Prints the table mutant / bug class / tests that caught it, then the per-class kill
report: for each bug class, its mutants, whether the default CPU tier catches every one, and the
tier of each killing test (``default``, ``slow`` or ``gpu``, recorded by the plugin), so a class
caught only by a slow or GPU-only test shows. ``--tiers all`` also runs the ``slow`` and ``gpu``
tests (GPU ones skip without CUDA). With ``--write-table`` both tables replace the block between
the ``mutant-table`` markers of a Markdown file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from infer_ref.conformance.mutants import ALL_BUG_CLASSES, MUTANTS, Mutant

START_MARKER = "<!-- mutant-table:start -->"
END_MARKER = "<!-- mutant-table:end -->"


@dataclass
class Outcome:
    mutant: Mutant
    returncode: int
    caught_by: list[str]
    seconds: float
    tail: str
    tiers: dict[str, str] = field(default_factory=dict)  # collapsed test id -> tier that ran it
    named: list[str] = field(default_factory=list)  # bug classes with a failed test in the report's table
    blame: dict[str, str] = field(default_factory=dict)  # candidate class -> the report's blame verdict

    @property
    def caught(self) -> bool:
        return self.returncode == 1 and bool(self.caught_by)


def default_tests_dir() -> Path:
    """The conformance tests shipped in the package (``infer_ref/conformance/tests``)."""
    return Path(__file__).resolve().parents[1] / "tests"


def failed_tests(junit: Path) -> list[str]:
    """Node ids (file::name[param]) of the failed or errored test cases of a JUnit XML report."""
    return list(failed_test_tiers(junit))


def failed_test_tiers(junit: Path) -> dict[str, str]:
    """Failed or errored node ids -> their tier (the plugin's ``ir_tier`` property; ``default`` if absent)."""
    if not junit.is_file():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").rsplit(".", 1)[-1]
            tier = next((p.get("value", "default") for p in case.iter("property") if p.get("name") == "ir_tier"), "default")
            out[f"{module}.py::{case.get('name')}"] = tier
    return out


def collapse(node_ids: list[str]) -> list[str]:
    """``f::t[a]``, ``f::t[b]`` -> ``f::t[a, b]`` (``f::t[N cases]`` past three): one entry per test function."""
    groups: OrderedDict[str, list[str]] = OrderedDict()
    for node in node_ids:
        base, _, param = node.partition("[")
        groups.setdefault(base, [])
        if param:
            groups[base].append(param.rstrip("]"))
    out = []
    for base, params in groups.items():
        if not params:
            out.append(base)
        elif len(params) <= 3:
            out.append(f"{base}[{', '.join(params)}]")
        else:
            out.append(f"{base}[{len(params)} cases]")
    return out


def run_one(mutant: Mutant, tests_dir: Path, extra: list[str]) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        report = Path(tmp) / "report.json"
        targets = [str(tests_dir / t) for t in mutant.targets]
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *targets,
            f"--ir-impl={mutant.impl}",
            "--hypothesis-profile=mutants",
            "-p",
            "no:cacheprovider",
            "-q",
            "--no-header",
            "-rN",
            f"--junitxml={junit}",
            f"--ir-report={report}",
            *extra,
        ]
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(Path.cwd()))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - t0
        failed = failed_test_tiers(junit)
        tiers: dict[str, str] = {}
        for node, tier in failed.items():  # a test function is as cheap as its cheapest failing case
            base = node.partition("[")[0]
            tiers[base] = min(tiers.get(base, tier), tier, key=TIER_ORDER.index)
        caught_by = collapse(list(failed))
        by_test = {t: tiers[t.partition("[")[0]] for t in caught_by}
        tail = (proc.stdout + proc.stderr)[-2000:]
        named, blame = blame_of(report)
        return Outcome(mutant, proc.returncode, caught_by, seconds, tail, by_test, named, blame)


def blame_of(report: Path) -> tuple[list[str], dict[str, str]]:
    """From a conformance report (``--ir-report`` JSON): the bug classes its table names (those with
    a failed test) and its blame verdict for each."""
    if not report.is_file():
        return [], {}
    data = json.loads(report.read_text())
    named = [name for name, tally in data.get("by_bug_class", {}).items() if tally["counts"]["failed"]]
    return named, {name: b["verdict"] for name, b in data.get("blame", {}).items()}


TIER_ORDER = ("default", "slow", "gpu")


def _test_label(o: Outcome, test: str) -> str:
    tier = o.tiers.get(test, "default")
    return f"`{test}`" if tier == "default" else f"`{test}` ({tier})"


def table(outcomes: list[Outcome]) -> str:
    lines = ["| mutant | bug class (docs/design.md) | tests that caught it | the report blames |", "|---|---|---|---|"]
    for o in outcomes:
        caught = "<br>".join(_test_label(o, t) for t in o.caught_by) if o.caught else f"**NOT CAUGHT** (pytest exit {o.returncode})"
        lines.append(f"| `{o.mutant.name}` | {o.mutant.bug_class} | {caught} | {blame_label(o)} |")
    return "\n".join(lines)


def blamed_alone(o: Outcome) -> bool:
    """The report implicates the planted bug's class and no other."""
    return [c for c, v in o.blame.items() if v == "implicated"] == [o.mutant.bug_class]


def blame_label(o: Outcome) -> str:
    """``its class`` when implicated alone, else what the report implicated and left possible, and
    how many classes its table named (what a report without the blame would have blamed)."""
    implicated = [c for c, v in o.blame.items() if v == "implicated"]
    possible = [c for c, v in o.blame.items() if v == "possible"]
    text = "its class" if blamed_alone(o) else "; ".join(implicated) or "**nothing implicated**"
    if possible:
        text += f" (possible: {'; '.join(possible)})"
    return f"{text} — of {len(o.named)} named"


def class_report(outcomes: list[Outcome]) -> str:
    """Per bug class: its mutants, whether the default tier catches each, the killing tests per tier."""
    lines = [
        "| bug class | mutants | caught by the default CPU tier | killing tests by tier |",
        "|---|---|---|---|",
    ]
    for bug_class in ALL_BUG_CLASSES:
        mine = [o for o in outcomes if o.mutant.bug_class == bug_class]
        if not mine:
            continue
        default = [o for o in mine if any(t == "default" for t in o.tiers.values())]
        verdict = "yes" if len(default) == len(mine) else f"**{len(default)} of {len(mine)}**"
        counts = {tier: sum(1 for o in mine for t in o.tiers.values() if t == tier) for tier in TIER_ORDER}
        by_tier = ", ".join(f"{tier} {n}" for tier, n in counts.items() if n) or "**none**"
        names = ", ".join(f"`{o.mutant.name}`" for o in mine)
        lines.append(f"| {bug_class} | {names} | {verdict} | {by_tier} |")
    return "\n".join(lines)


def outcome_record(o: Outcome) -> dict[str, object]:
    return {
        "mutant": o.mutant.name, "bug_class": o.mutant.bug_class, "caught": o.caught, "caught_by": o.caught_by,
        "named": o.named, "blame": o.blame,
    }  # fmt: skip


def write_table(path: Path, text: str, command: str) -> None:
    doc = path.read_text()
    if START_MARKER not in doc or END_MARKER not in doc:
        raise SystemExit(f"{path} has no {START_MARKER} ... {END_MARKER} block")
    head, rest = doc.split(START_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    generated = f"{START_MARKER}\n<!-- generated by `{command}`; do not edit by hand -->\n\n{text}\n\n{END_MARKER}"
    path.write_text(head + generated + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infer_ref.conformance.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2, help="mutants run in parallel (default: CPU count)")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME", help="run these mutants only")
    parser.add_argument("--tests", type=Path, default=None, help="conformance test directory (default: the package's infer_ref/conformance/tests)")
    parser.add_argument("--write-table", type=Path, default=None, metavar="MD", help="replace the mutant table in this Markdown file")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write each mutant's outcome (caught by, blamed classes) as JSON")
    parser.add_argument(
        "--tiers",
        choices=("default", "all"),
        default="default",
        help="default: the default CPU tier only; all: also the slow and gpu tests (GPU ones skip without CUDA)",
    )
    args, extra = parser.parse_known_args(argv)

    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name:32} {m.bug_class}: {m.doc}")
        return 0
    unknown = sorted(set(args.only or ()) - set(MUTANTS))
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; known: {', '.join(MUTANTS)}")
    chosen = [m for m in MUTANTS.values() if args.only is None or m.name in args.only]
    if args.tiers == "all":
        extra = ["-m", "not benchmark", *extra]
    tests_dir = args.tests or default_tests_dir()
    if not tests_dir.is_dir():
        parser.error(f"no property tests at {tests_dir}: run from the repository root or pass --tests")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda m: run_one(m, tests_dir, extra), chosen))
    elapsed = time.perf_counter() - t0

    print(table(outcomes))
    print()
    print(class_report(outcomes))
    print()
    for o in outcomes:
        print(f"{o.mutant.name:32} {'caught' if o.caught else 'NOT CAUGHT'} in {o.seconds:5.1f}s ({len(o.caught_by)} tests)")
    missed = [o for o in outcomes if not o.caught]
    for o in missed:
        print(f"\n--- {o.mutant.name}: pytest exit {o.returncode}, output tail:\n{o.tail}", file=sys.stderr)
    alone = sum(blamed_alone(o) for o in outcomes if o.caught)
    print(f"\n{len(outcomes) - len(missed)}/{len(outcomes)} mutants caught in {elapsed:.0f}s with {args.jobs} job(s); "
          f"{alone} blamed on their own class alone")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps([outcome_record(o) for o in outcomes], indent=1) + "\n")
    if args.write_table is not None and args.only is None:
        report = table(outcomes) + "\n\nPer bug class (the tier of each killing test: `default` runs in `pytest -n auto`):\n\n" + class_report(outcomes)
        write_table(args.write_table, report, "python -m infer_ref.conformance.mutants --write-table " + str(args.write_table))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
