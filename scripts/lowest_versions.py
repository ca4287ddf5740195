"""The lowest versions pyproject.toml declares, as pip requirements (``name==floor``, one a line).

    python scripts/lowest_versions.py > lowest.txt
    pip install -r lowest.txt && pip install --no-deps -e .    # the dependencies and test extras at their floors

``.ci/run``'s lowest-versions stage installs them in a venv of its own and runs the default tier
there, so every floor pyproject declares is one the suite has passed on. A dependency in ``UNPINNED``
keeps its declared range (pip picks), for the reason given there. Needs Python 3.11 (tomllib).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# Resolved by pip instead: no release at the floor installs on CI's Python.
UNPINNED = {"xxhash": "3.0 has no wheel for Python 3.11 (the lowest with one is 3.2); its xxh64 is unchanged"}
FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)$")


def floors(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Each dependency and test extra with a ``>=`` floor, by name (the first floor if one repeats)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found: dict[str, str] = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        match = FLOOR.match(requirement.split(";")[0].strip())
        if match is None:
            raise SystemExit(f"{pyproject}: {requirement!r} has no single '>=' floor to install")
        found.setdefault(match.group(1), match.group(2))
    return found


def main() -> None:
    for name, floor in floors().items():
        sys.stdout.write(f"{name}{'>=' if name in UNPINNED else '=='}{floor}\n")


if __name__ == "__main__":
    main()
