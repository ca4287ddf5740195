"""scripts/mutation.py: how parts are sliced and scored (docs/mutation.md), without running mutmut."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from fnmatch import fnmatch
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def mutation(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("mutation")


def _names(mutation, part: str) -> list[str]:
    # One synthetic function per glob of the part, mutants numbered 1..137 as mutmut numbers them.
    return [glob.replace("*", "f") + f"__mutmut_{n}" for glob in mutation.PARTS[part] for n in range(1, 138)]


@pytest.mark.parametrize("count", [1, 2, 5, 10])
def test_the_slices_of_a_part_cover_each_mutant_exactly_once(mutation, count):
    for part in mutation.PARTS:
        names = _names(mutation, part)
        slices = [mutation.slice_globs(part, index, count) for index in range(count)]
        for name in names:
            hits = [i for i, globs in enumerate(slices) if any(fnmatch(name, g) for g in globs)]
            number = int(name.rpartition("_")[2])
            assert hits == [number % count], (name, hits)


def test_a_slice_holds_a_tenth_of_every_function_for_ten_slices(mutation):
    names = _names(mutation, "engine")
    globs = mutation.slice_globs("engine", 7, 10)
    chosen = [n for n in names if any(fnmatch(n, g) for g in globs)]
    # numbers 1..137 ending in 7: 7, 17, ..., 137 = 14 per function
    assert len(chosen) == 14 * len(mutation.PARTS["engine"])
    assert chosen == [n for n in names if n.endswith("7")]


@pytest.mark.parametrize(("index", "count"), [(0, 3), (0, 4), (2, 2), (-1, 5), (10, 10)])
def test_a_slice_that_cannot_be_written_as_digit_globs_is_refused(mutation, index, count):
    with pytest.raises(SystemExit, match="count must be 1, 2, 5 or 10"):
        mutation.slice_globs("cache", index, count)


def test_every_part_has_a_slice_count_that_divides_ten(mutation):
    assert set(mutation.SLICES) == set(mutation.PARTS)
    assert all(10 % n == 0 for n in mutation.SLICES.values())


def test_the_score_counts_timeouts_as_killed_and_leaves_out_equivalents_and_unrun(mutation):
    row = Counter({"generated": 20, "killed": 12, "timed out": 1, "survived": 2, "no tests": 1,
                   "equivalent": 3, "not run": 1})
    assert mutation.score(row) == pytest.approx(13 / 16)
    assert mutation.score(Counter({"generated": 2, "equivalent": 2})) != mutation.score(Counter())  # NaN


@pytest.mark.parametrize(("code", "listed", "expected"), [
    (1, True, "killed"), (0, True, "equivalent"), (0, False, "survived"), (33, False, "no tests"),
    (5, False, "no tests"), (-24, False, "timed out"), (None, False, "not run"), (2, False, "not run"),
    (99, False, "suspicious"),
])
def test_each_exit_code_lands_in_its_column(mutation, code, listed, expected):
    name = "infer_ref.cache.paged.x_f__mutmut_1"
    assert mutation.status(code, name, {name: "why"} if listed else {}) == expected


def test_every_listed_equivalent_names_a_mutant_of_some_part(mutation):
    equivalents = mutation.equivalent()
    assert equivalents, "scripts/mutation_equivalent.txt lists no mutant"
    stray = [name for name in equivalents if "__mutmut_" not in name or mutation.part_of(name) is None]
    assert not stray, f"not a mutant of any part (a typo?): {stray}"


@pytest.mark.parametrize(("fraction", "shown"), [(4490 / 4492, "99.9%"), (1.0, "100.0%"), (0.9999, "99.9%"),
                                                 (0.5, "50.0%"), (float("nan"), "n/a")])
def test_a_score_short_of_one_never_prints_as_100_percent(mutation, fraction, shown):
    assert mutation.percent(fraction) == shown


def test_the_total_row_sums_the_parts_and_scores_the_sum(mutation):
    table = {"cache": Counter({"generated": 10, "killed": 9, "survived": 1}),
             "engine": Counter({"generated": 4, "killed": 2, "equivalent": 2})}
    total = mutation.markdown(table).splitlines()[-1]
    # killed 11 of 14 generated less 2 equivalent = 11/12 = 91.66...% -> 91.6%
    assert total.startswith("| **all** | **14** | **11** | **1** |") and total.endswith("| **91.6%** |")


def test_the_module_table_groups_methods_and_functions_by_their_module(mutation, monkeypatch):
    codes = {"infer_ref.cache.paged.xǁPagedKVCacheǁ_slots__mutmut_3": 0,
             "infer_ref.cache.paged.x_free__mutmut_1": 1,
             "infer_ref.engine.scheduler.x_schedule__mutmut_2": 1}
    monkeypatch.setattr(mutation, "results", lambda: codes)
    monkeypatch.setattr(mutation, "equivalent", dict)
    table = mutation.figures(by_module=True)
    assert table == {"infer_ref.cache.paged": Counter(generated=2, killed=1, survived=1),
                     "infer_ref.engine.scheduler": Counter(generated=1, killed=1)}


def test_the_json_record_holds_the_tree_the_day_and_both_tables(mutation):
    parts = {"cache": Counter({"generated": 2, "killed": 2})}
    modules = {"infer_ref.cache.paged": Counter({"generated": 2, "killed": 2})}
    record = mutation.record(parts, modules)
    assert record["parts"] == {"cache": {"generated": 2, "killed": 2}}
    assert record["modules"] == {"infer_ref.cache.paged": {"generated": 2, "killed": 2}}
    assert len(record["tree"]) >= 7 and len(record["date"]) == len("2026-01-02")
