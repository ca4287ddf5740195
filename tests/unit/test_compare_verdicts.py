"""scripts/compare_verdicts.py: verdicts test by test, and --judged-only for a server asked fewer things."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def script(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("compare_verdicts")


def junit(path: Path, cases: dict[str, str]) -> str:
    body = {"passed": "", "failed": "<failure/>", "skipped": "<skipped/>", "xfailed": '<skipped type="pytest.xfail"/>'}
    path.write_text("<testsuite>" + "".join(f'<testcase classname="m.T" name="{n}">{body[v]}</testcase>'
                                            for n, v in cases.items()) + "</testsuite>")  # fmt: skip
    return str(path)


def test_verdicts_must_be_equal_unless_only_the_judged_ones_are_compared(script: ModuleType, tmp_path: Path) -> None:
    inproc = junit(tmp_path / "a.xml", {"t1": "passed", "t2": "xfailed", "t3": "passed"})
    server = junit(tmp_path / "b.xml", {"t1": "passed", "t2": "xfailed", "t3": "skipped"})
    assert script.main([inproc, server]) == 1  # t3: passed vs skipped
    assert script.main(["--judged-only", inproc, server]) == 0
    wolf = junit(tmp_path / "c.xml", {"t1": "failed", "t2": "xfailed", "t3": "skipped"})
    assert script.main(["--judged-only", inproc, wolf]) == 1  # a failure the engine in-process does not have
    assert script.main(["--judged-only", inproc, junit(tmp_path / "d.xml", {"t3": "skipped"})]) == 0  # none judged
