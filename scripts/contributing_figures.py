"""CONTRIBUTING.md's measured figures, generated from the runs that measured them.

    python scripts/contributing_figures.py tier dir/after.xml dir/after.time --where "..." \\
        [--baseline dir/before.time] [--write CONTRIBUTING.md]
    python scripts/contributing_figures.py ci ci.log --where "..." [--write CONTRIBUTING.md]
    python scripts/contributing_figures.py gpu benchmarks/log/gpu_ci.json [--write CONTRIBUTING.md]

``tier``: the default tier's wall and CPU time and its slowest tests, from
``scripts/measure_test_tier.sh``'s files (``NAME.time`` holds "wall_s user_s sys_s", children
included; ``NAME.xml`` the run's JUnit XML). ``ci``: the time of each stage of ``.ci/run``, from
its output (the ``=== stage done in N s: NAME`` lines). ``gpu``: the latest run of
``scripts/gpu_ci.sh`` from its result file (``scripts/gpu_ci.py record`` writes it; without the file
the block says no run is recorded). Without ``--write`` a block is printed; with it, the block
replaces the one between that figure's markers in the file (``test-tier-figures``,
``ci-stage-times`` or ``gpu-ci``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TIER_MARKERS = ("<!-- test-tier-figures:start -->", "<!-- test-tier-figures:end -->")
CI_MARKERS = ("<!-- ci-stage-times:start -->", "<!-- ci-stage-times:end -->")
GPU_MARKERS = ("<!-- gpu-ci:start -->", "<!-- gpu-ci:end -->")
GPU_VERSIONS = ("torch", "transformers", "triton", "pytest", "pytest-xdist", "pytest-benchmark", "hypothesis")
SLOWEST = 15
STAGE_DONE = re.compile(r"^=== stage done in (\d+) s: (.+)$")


def read_times(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) from a ``wall user sys`` line."""
    wall, user, system = (float(x) for x in path.read_text().split()[:3])
    return wall, user + system


def read_tests(path: Path) -> tuple[list[tuple[float, str]], dict[str, int]]:
    """Every test case's (seconds, node id), slowest first, and the counts by outcome."""
    cases, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        cases.append((float(case.get("time") or 0.0), f"{module}::{case.get('name')}"))
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return sorted(cases, reverse=True), counts


def tier_block(xml: Path, times: Path, where: str, baseline: Path | None) -> str:
    wall, cpu = read_times(times)
    cases, counts = read_tests(xml)
    lines = [
        TIER_MARKERS[0],
        f"Measured {where}: **{wall:.0f} s wall, {cpu:.0f} CPU-seconds** "
        f"({counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed; "
        f"{sum(t for t, _ in cases):.0f} s of test time).",
    ]
    if baseline is not None:
        old_wall, old_cpu = read_times(baseline)
        lines[-1] += f" The tree before, in the same run: {old_wall:.0f} s wall, {old_cpu:.0f} CPU-seconds."
    lines += [
        "",
        "```bash",
        "OUT=dir scripts/measure_test_tier.sh before=OLD_TREE after=.   # each tree on 2 cores of its own",
        "python scripts/contributing_figures.py tier dir/after.xml dir/after.time --baseline dir/before.time --where '...' --write CONTRIBUTING.md",
        "```",
        "",
        f"The {SLOWEST} slowest tests of that run:",
        "",
        "| s | test |",
        "|---|---|",
        *(f"| {t:.1f} | `{name}` |" for t, name in cases[:SLOWEST]),
        TIER_MARKERS[1],
    ]
    return "\n".join(lines)


def read_stages(log: Path) -> list[tuple[int, str]]:
    """(seconds, name) of every stage the log shows done, in order."""
    found = (STAGE_DONE.match(line.rstrip("\n")) for line in log.read_text(errors="replace").splitlines())
    return [(int(m.group(1)), m.group(2)) for m in found if m]


def ci_block(log: Path, where: str) -> str:
    stages = read_stages(log)
    if not stages:
        raise SystemExit(f"{log}: no '=== stage done in N s: NAME' line (is it the output of .ci/run?)")
    total = sum(t for t, _ in stages)
    return "\n".join([
        CI_MARKERS[0],
        f"Measured {where}: **{total / 60:.1f} minutes** for the {len(stages)} stages below.",
        "",
        "| stage | s |",
        "|---|---|",
        *(f"| {name} | {t} |" for t, name in stages),
        f"| **total** | **{total}** |",
        CI_MARKERS[1],
    ])


def _stage_row(stage: dict) -> str:
    counts = [str(stage["counts"].get(k, "")) for k in ("passed", "failed", "skipped")]
    return f"| {stage['name']} | {stage['seconds']:.0f} | {stage['exit_status']} | {' | '.join(counts)} |"


def gpu_block(result_path: Path) -> str:
    """The latest GPU CI run: where it ran, each stage's time and counts, the slowest GPU tests."""
    name = f"`{result_path.as_posix()}`"
    if not result_path.is_file():
        return "\n".join([GPU_MARKERS[0], f"No run of `scripts/gpu_ci.sh` is recorded yet ({name} is absent).",
                          GPU_MARKERS[1]])  # fmt: skip
    run = json.loads(result_path.read_text())
    versions = ", ".join(f"{k} {run['versions'][k]}" for k in GPU_VERSIONS if run["versions"].get(k))
    verdict = "passed" if run["passed"] else "FAILED"
    stages = run["stages"]
    lines = [
        GPU_MARKERS[0],
        f"The latest run of `scripts/gpu_ci.sh` ({name}): tree {run['tree']}, {run['date']}, {run['gpu']} "
        f"with {run['cpus']} CPUs, python {run['python']}, {versions}: **{verdict} in {run['total_s']:.0f} s** "
        f"(the stages; the install before them: {run['install_s']:.0f} s).",
        "",
        "| stage | s | exit status | passed | failed | skipped |",
        "|---|---|---|---|---|---|",
        *(_stage_row(st) for st in stages),
    ]
    lines += [f"- {st['key']}: {st['note']}" for st in stages if st["note"]]
    slowest = next((st["slowest"] for st in stages if st["key"] == "gpu"), [])
    if slowest:
        lines += ["", f"The {len(slowest)} slowest tests of `pytest -m gpu` in that run:", "", "| s | test |", "|---|---|",
                  *(f"| {t:.1f} | `{test}` |" for t, test in slowest)]  # fmt: skip
    return "\n".join([*lines, GPU_MARKERS[1]])


def replace_block(text: str, new_block: str, path: Path, markers: tuple[str, str]) -> str:
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{path}: no {start} ... {end} block to replace")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return head + new_block + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    figures = parser.add_subparsers(dest="figure", required=True)
    tier = figures.add_parser("tier", help="the default tier's cost and slowest tests")
    tier.add_argument("xml", type=Path)
    tier.add_argument("times", type=Path)
    tier.add_argument("--baseline", type=Path, default=None, help="the .time file of the tree before")
    ci = figures.add_parser("ci", help="the time of each stage of .ci/run")
    ci.add_argument("log", type=Path)
    gpu = figures.add_parser("gpu", help="the latest run of scripts/gpu_ci.sh")
    gpu.add_argument("result", type=Path, help="its result file (benchmarks/log/gpu_ci.json)")
    for sub in (tier, ci):
        sub.add_argument("--where", required=True, help="the machine, cores and settings of the run, as a phrase")
    for sub in (tier, ci, gpu):
        sub.add_argument("--write", type=Path, default=None, help="replace the marked block of this Markdown file")
    args = parser.parse_args()
    if args.figure == "tier":
        new_block, markers = tier_block(args.xml, args.times, args.where, args.baseline), TIER_MARKERS
    elif args.figure == "ci":
        new_block, markers = ci_block(args.log, args.where), CI_MARKERS
    else:
        new_block, markers = gpu_block(args.result), GPU_MARKERS
    if args.write is None:
        sys.stdout.write(new_block + "\n")
        return
    args.write.write_text(replace_block(args.write.read_text(), new_block, args.write, markers))


if __name__ == "__main__":
    main()
