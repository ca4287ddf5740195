"""scripts/contributing_figures.py: CONTRIBUTING.md's figures (the default tier's cost, .ci/run's stage
times) come from the files of the runs that measured them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def script(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("contributing_figures")


def write_run(folder: Path, times: dict[str, float], wall: str) -> tuple[Path, Path]:
    xml, time = folder / "run.xml", folder / "run.time"
    cases = "".join(
        f'<testcase classname="tests.unit.test_m" name="{name}" time="{t}">{"<skipped/>" if name.startswith("skip") else ""}</testcase>'
        for name, t in times.items()
    )
    xml.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    time.write_text(wall)
    return xml, time


def test_the_block_has_wall_cpu_counts_and_the_slowest_tests_in_order(script: ModuleType, tmp_path: Path) -> None:
    times = {f"test_{i}": float(i) for i in range(20)} | {"skip_me": 0.0}
    xml, time = write_run(tmp_path, times, "150.4 200.25 10.5\n")
    text = script.tier_block(xml, time, "on two cores", None)
    # 200.25 + 10.5 CPU-seconds; 0 + 1 + ... + 19 = 190 s of test time
    assert "Measured on two cores: **150 s wall, 211 CPU-seconds** (20 passed, 1 skipped, 0 failed; 190 s of test time)." in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert [row.split("`")[1] for row in rows] == [f"tests/unit/test_m.py::test_{i}" for i in range(19, 4, -1)]


def test_a_baseline_is_named_beside_the_figure(script: ModuleType, tmp_path: Path) -> None:
    xml, time = write_run(tmp_path, {"test_a": 1.0}, "100 50 10")
    before = tmp_path / "before.time"
    before.write_text("400.6 600 40")
    assert "The tree before, in the same run: 401 s wall, 640 CPU-seconds." in script.tier_block(xml, time, "x", before)


def test_write_replaces_only_the_marked_block(script: ModuleType, tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    start, end = script.TIER_MARKERS
    doc.write_text(f"intro\n{start}\nold figures\n{end}\n{script.CI_MARKERS[0]}\nci\n{script.CI_MARKERS[1]}\n")
    new = script.replace_block(doc.read_text(), f"{start}\nnew\n{end}", doc, script.TIER_MARKERS)
    assert new == f"intro\n{start}\nnew\n{end}\n{script.CI_MARKERS[0]}\nci\n{script.CI_MARKERS[1]}\n"
    with pytest.raises(SystemExit, match="no <!-- test-tier-figures:start --> ... <!-- test-tier-figures:end --> block"):
        script.replace_block("no markers here", "x", doc, script.TIER_MARKERS)


def test_the_ci_table_lists_each_stage_done_and_their_sum(script: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "ci.log"
    log.write_text(
        "=== stage: one\nnoise\n=== stage done in 120 s: one\n=== stage: two (with: a colon)\n"
        "=== stage done in 30 s: two (with: a colon)\n===   total 151 s\n"
    )
    text = script.ci_block(log, "cold, 2 cores")
    # 120 + 30 = 150 s = 2.5 minutes
    assert "Measured cold, 2 cores: **2.5 minutes** for the 2 stages below." in text
    assert "| one | 120 |\n| two (with: a colon) | 30 |\n| **total** | **150** |" in text
    log.write_text("no stages here\n")
    with pytest.raises(SystemExit, match="no '=== stage done in N s: NAME' line"):
        script.ci_block(log, "x")
