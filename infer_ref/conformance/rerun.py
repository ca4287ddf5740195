"""The pytest command that reruns one test of the kit wherever the kit is installed.

A node id's path holds where pytest ran from (a checkout, a venv's site-packages), which another
machine does not have; the test's module named by package (``--pyargs``) and the test by its name and
parameters (``-k``) work from a wheel install and from a checkout alike. Used by the report's "first
failure" lines, the engine tier's failure lines and the in-process tier's ``repro:`` line.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ENGINE_TESTS, ADAPTER_TESTS = "infer_ref.conformance.engines.tests", "infer_ref.conformance.tests"
PACKAGE = "infer_ref"


def _package_module(path: str) -> str | None:
    """``.../infer_ref/conformance/tests/test_masks.py`` -> ``infer_ref.conformance.tests.test_masks``;
    None for a file outside the package (the repository's own tests)."""
    parts = Path(path).with_suffix("").parts
    if PACKAGE not in parts:
        return None
    last = len(parts) - 1 - parts[::-1].index(PACKAGE)  # site-packages/infer_ref/...: the last one
    return ".".join(parts[last:])


def pyargs_command(nodeid: str, selects: str) -> str:
    """``pytest --pyargs <module> -p no:xdist -k <test> <selects>`` for a test of the kit's packages;
    ``selects`` names what is judged (``--ir-impl=...``, ``--ir-engine=...``) and any other option. A
    node id without the package's folders (``test_masks.py::...``) is placed by ``selects``."""
    path, _, name = nodeid.partition("::")
    engine_tier = selects.startswith(("--ir-engine", "--ir-endpoint"))
    module = _package_module(path) or f"{ENGINE_TESTS if engine_tier else ADAPTER_TESTS}.{Path(path).stem}"
    if not re.fullmatch(r"[\w:+\-.\[\]\\/]+", name):  # -k takes no spaces or parentheses: then every case
        name = name.partition("[")[0]
    return f"pytest --pyargs {module} -p no:xdist -k {shlex.quote(name)} {selects}".rstrip()


def rerun_command(nodeid: str, selects: str) -> str:
    """:func:`pyargs_command` for a test of the package; a test outside it (the repository's own suite,
    run from its checkout) by its node id."""
    path = nodeid.partition("::")[0]
    if _package_module(path) is not None:
        return pyargs_command(nodeid, selects)
    return f"pytest {shlex.quote(nodeid)} -p no:xdist {selects}".rstrip()


__all__ = ["ADAPTER_TESTS", "ENGINE_TESTS", "pyargs_command", "rerun_command"]
