"""Expected-failure files (``--xfails``): which entries apply here, and whether a test id matches one.

Apart from the plugin that applies them, so that what reads results back (the engine matrix) can
use the same rules without importing pytest's plugin (and the kit's adapters with it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DTYPE_NAMES = ("float64", "float32", "bfloat16", "float16")  # a dtype condition names one of these


def read_xfails(path: str | Path, device: str = "cpu", dtype: str | None = None) -> list[str]:
    """Test-id prefixes from an xfail file: blank lines and ``#`` comments ignored.

    An entry may end with conditions in brackets, all of which must hold for it to apply:
    ``[transformers<5.23]`` (an installed package's version: ``<``, ``<=``, ``==``, ``>=``, ``>``)
    and ``[cuda]`` / ``[cpu]`` (the device under test), and a dtype (``[float32]``: the dtype under
    test, the engine's in the engine tier; with ``dtype`` None, as for results read back, a dtype
    condition never holds). A behaviour a library fixed in a later release, one that only shows on
    a GPU or only at one precision, is then listed once and is never stale where it does not apply.
    ``[may pass]`` is no condition: it marks an expected failure that shows on some machines only
    (:func:`xfail_entries`).
    """
    return [prefix for prefix, _ in xfail_entries(path, device, dtype)]


MAY_PASS = "may pass"


def xfail_entries(path: str | Path, device: str = "cpu", dtype: str | None = None) -> list[tuple[str, bool]]:
    """The entries of an xfail file that apply (:func:`read_xfails`), each with whether it is strict.

    An entry marked ``[may pass]`` is not strict: a difference that crosses the tolerance on some
    CPUs and not on others (an engine's rounding depends on the SIMD path it was built for) is an
    expected failure where it shows and a pass where it does not, never an unexpected pass.
    """
    entries = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        # Conditions are bracket groups after whitespace at the end; a test id's own parameters
        # ("test_x[write past capacity]") follow the name directly.
        strict = True
        tail = re.search(r"(?:\s+\[[^\[\]]*\])+\s*$", line)
        if tail is not None:
            conditions = [c.strip() for c in re.findall(r"\[([^\[\]]*)\]", tail.group(0))]
            strict = MAY_PASS not in conditions
            line = line[: tail.start()].strip()
            if not all(_condition_holds(c, device, dtype, f"{path}:{number}") for c in conditions if c != MAY_PASS):
                continue
        if line:
            entries.append((line, strict))
    return entries


_VERSION_CONDITION = re.compile(r"^([A-Za-z0-9_.-]+)\s*(<=|>=|==|<|>)\s*([0-9][0-9A-Za-z.+-]*)$")


def _condition_holds(text: str, device: str, dtype: str | None, where: str) -> bool:
    """One bracketed xfail condition (see :func:`read_xfails`); a malformed one is a usage error."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    text = text.strip()
    if text in ("cuda", "cpu"):
        return device.split(":", 1)[0] == text
    if text in DTYPE_NAMES:
        return dtype == text
    found = _VERSION_CONDITION.match(text)
    if found is None:
        raise pytest.UsageError(f"{where}: condition [{text}] is neither [cuda], [cpu], a dtype ([float32]) nor [package<op>version]")
    package, op, wanted = found.groups()
    try:
        installed = Version(version(package))
    except PackageNotFoundError:
        return False
    compare = {"<": installed.__lt__, "<=": installed.__le__, "==": installed.__eq__, ">=": installed.__ge__, ">": installed.__gt__}
    return bool(compare[op](Version(wanted)))


def matches(nodeid: str, prefix: str) -> bool:
    """``prefix`` matches the full node id or the id without its directories."""
    return nodeid.startswith(prefix) or nodeid.rsplit("/", 1)[-1].startswith(prefix)
