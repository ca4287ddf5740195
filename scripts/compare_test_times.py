"""Two runs of the same suite compared test by test, from their JUnit XML files.

    python scripts/compare_test_times.py OLD.xml NEW.xml

Prints the summed time of the tests both runs have and both passed (old, new, ratio), the tests
only one run has with their time, and the tests that moved most. A test that failed in either run
is left out of the common sum: a failure often ends a test early, so its time says nothing.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TestId = tuple[str, str]  # (module, test name): stable when a test file moves between folders


def load(path: Path) -> tuple[dict[TestId, float], set[TestId]]:
    """Each test's time in seconds, and the tests that failed or errored."""
    times: dict[TestId, float] = {}
    failed: set[TestId] = set()
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""))
        times[key] = times.get(key, 0.0) + float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(key)
    return times, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    args = parser.parse_args()
    old, old_failed = load(args.old)
    new, new_failed = load(args.new)
    common = (old.keys() & new.keys()) - old_failed - new_failed
    before, after = sum(old[k] for k in common), sum(new[k] for k in common)
    print(f"tests both runs passed: {len(common)}; their time: old {before:.0f} s, new {after:.0f} s ({after / before:.3f})")
    for name, mine, other in (("old", old, new), ("new", new, old)):
        only = mine.keys() - other.keys()
        by_module = Counter({m: 0.0 for m, _ in only})
        for key in only:
            by_module[key[0]] += mine[key]
        top = ", ".join(f"{m} {t:.0f} s" for m, t in by_module.most_common(6))
        print(f"only in {name}: {len(only)} tests, {sum(mine[k] for k in only):.0f} s ({top})")
    failed = sorted(k[1] for k in (old_failed | new_failed) & (old.keys() | new.keys()))
    print(f"failed in either run (left out): {len(failed)}")
    moved = sorted(common, key=lambda k: new[k] - old[k])
    print("slower the most: " + ", ".join(f"{k[1][:50]} {old[k]:.1f}->{new[k]:.1f}" for k in moved[-5:][::-1]))


if __name__ == "__main__":
    main()
