"""CONTRIBUTING.md's figures of the default tier, from a measured run: its wall and CPU time, the
command that measured it, and its slowest tests.

    OUT=dir scripts/measure_test_tier.sh before=OLD_TREE after=.    # on a machine with quiet cores
    python scripts/test_tier_figures.py dir/after.xml dir/after.time --where "..." [--baseline dir/before.time] \\
        [--write CONTRIBUTING.md]

``NAME.time`` holds "wall_s user_s sys_s" (children included), ``NAME.xml`` the run's JUnit XML.
Without ``--write`` the block is printed; with it, the block replaces the one between the
``test-tier-figures`` markers of that file.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

START_MARKER = "<!-- test-tier-figures:start -->"
END_MARKER = "<!-- test-tier-figures:end -->"
SLOWEST = 15


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


def block(xml: Path, times: Path, where: str, baseline: Path | None) -> str:
    wall, cpu = read_times(times)
    cases, counts = read_tests(xml)
    lines = [
        START_MARKER,
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
        "python scripts/test_tier_figures.py dir/after.xml dir/after.time --baseline dir/before.time --where '...' --write CONTRIBUTING.md",
        "```",
        "",
        f"The {SLOWEST} slowest tests of that run:",
        "",
        "| s | test |",
        "|---|---|",
        *(f"| {t:.1f} | `{name}` |" for t, name in cases[:SLOWEST]),
        END_MARKER,
    ]
    return "\n".join(lines)


def replace_block(text: str, new_block: str, path: Path) -> str:
    if START_MARKER not in text or END_MARKER not in text:
        raise SystemExit(f"{path}: no {START_MARKER} ... {END_MARKER} block to replace")
    head, _, rest = text.partition(START_MARKER)
    _, _, tail = rest.partition(END_MARKER)
    return head + new_block + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", type=Path)
    parser.add_argument("times", type=Path)
    parser.add_argument("--where", required=True, help="the machine, cores and settings of the run, as a phrase")
    parser.add_argument("--baseline", type=Path, default=None, help="the .time file of the tree before")
    parser.add_argument("--write", type=Path, default=None, help="replace the marked block of this Markdown file")
    args = parser.parse_args()
    new_block = block(args.xml, args.times, args.where, args.baseline)
    if args.write is None:
        sys.stdout.write(new_block + "\n")
        return
    args.write.write_text(replace_block(args.write.read_text(), new_block, args.write))


if __name__ == "__main__":
    main()
