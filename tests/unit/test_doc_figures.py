"""The docs' engine-tier figures are generated from the committed results, and a stale block fails
here: docs/conformance.md's largest distances from the oracle (old: typed, "infer_ref's Engine
3.0e-5" while its recorded run said 5.41e-05), docs/engines.md's run times (old: three versions of
infer_ref's, none from a result file) and docs/engines-matrix.md with its picture."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from infer_ref.conformance.engines.matrix.main import main as draw_matrix
from infer_ref.conformance.engines.verdicts import tolerances

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("doc_figures")


def test_every_generated_block_holds_what_the_committed_results_give(script: ModuleType) -> None:
    assert script.stale_blocks(ROOT) == [], "run: python scripts/doc_figures.py --write"


def _result(folder: Path, engine: str, largest: float, failed: int = 0) -> None:
    note = f"largest difference from the oracle: {largest:g} nats (test_x[llama-tiny], 3 answers); tolerance 0.0002 (the oracle tolerance for float32)"
    report = {"dtype": "float32", "notes": ["other note", note], "totals": {"counts": {"failed": failed}}}
    (folder / f"{engine}.json").write_text(json.dumps(report))
    (folder / f"{engine}.xml").write_text(
        '<testsuites><testsuite time="95.4" timestamp="2026-01-02T03:04:05"/></testsuites>'
    )


def test_the_distances_row_reads_each_reports_note_and_says_what_passed_the_tolerance_and_why(
    script: ModuleType, tmp_path: Path
) -> None:
    _result(tmp_path, "infer_ref", 5.41e-05)
    _result(tmp_path, "llama.cpp", 9.14)
    _result(tmp_path, "transformers-cuda-sdpa-float32", 2.82, failed=2)
    row = script.oracle_distances(tmp_path).splitlines()[-1]
    assert row == ("| float32 | 0.0002 | infer_ref 5.41e-05; past it: llama.cpp 9.14 (expected failures, its xfails file), "
                   "transformers-cuda-sdpa-float32 2.82 (2 failed) |")  # fmt: skip


def test_the_run_times_come_from_the_junit_files_of_both_workloads(
    script: ModuleType, tmp_path: Path
) -> None:
    _result(tmp_path, "vllm", 6e-05)
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "vllm.xml").write_text(
        '<testsuites><testsuite time="158" timestamp="2026-01-03T00:00:00"/></testsuites>'
    )
    _result(tmp_path, "openvino", 1e-05)
    assert script.engine_run_times(tmp_path).splitlines()[2:] == [
        "| vllm | 95 s on 2026-01-02 | 158 s on 2026-01-03 |",
        "| openvino | 95 s on 2026-01-02 | not recorded |",
    ]


def test_a_recorded_run_line_says_what_its_report_counted_left_out_and_how_long_it_ran(
    script: ModuleType, tmp_path: Path
) -> None:
    _result(tmp_path, "llama.cpp-server", 5.02, failed=1)
    report = json.loads((tmp_path / "llama.cpp-server.json").read_text())
    report["totals"]["counts"] = {"passed": 34, "failed": 1, "xfailed": 2, "not supported": 100, "skipped": 0}
    report["notes"].append(
        "requests left out because llama.cpp-server's answer cannot be read back as token ids: 356 of 600 (286x ...)"
    )
    (tmp_path / "llama.cpp-server.json").write_text(json.dumps(report))
    assert script.recorded_run("llama.cpp-server", tmp_path) == (
        "`docs/engine-results/llama.cpp-server`: 34 passed, 2 expected failures, 1 failed, 100 not supported, "
        "requests left out (an answer not readable as token ids): 356 of 600; ran 95 s on 2026-01-02."
    )
    with pytest.raises(SystemExit, match="no recorded run of vllm"):
        script.recorded_run("vllm", tmp_path)


def test_the_long_context_table_counts_each_engines_recorded_run_of_that_workload(
    script: ModuleType, tmp_path: Path
) -> None:
    _result(tmp_path, "infer_ref", 2.51e-3)
    _result(tmp_path, "ctranslate2", 47, failed=0)
    report = json.loads((tmp_path / "ctranslate2.json").read_text())
    report["totals"]["counts"] = {"passed": 0, "xfailed": 12, "not supported": 24}
    (tmp_path / "ctranslate2.json").write_text(json.dumps(report))
    assert script.long_context_counts(tmp_path).splitlines()[2:] == [
        "| infer_ref | 0 | 0 | 0 | 0 | 0 | 0.00251 |",
        "| ctranslate2 | 0 | 12 | 0 | 24 | 0 | 47 |",
    ]


def test_the_mutation_tables_come_from_a_full_runs_record_or_say_how_to_make_one(
    script: ModuleType, tmp_path: Path
) -> None:
    record = tmp_path / "benchmarks" / "log" / "mutation.json"
    assert "scripts/mutation_background.sh" in script.mutation_scores(record)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({
        "tree": "abc1234", "date": "2026-01-02",
        "parts": {"cache": {"generated": 4, "killed": 2, "timed out": 1, "survived": 1}},
        "modules": {"infer_ref.cache.paged": {"generated": 4, "killed": 2, "timed out": 1, "survived": 1}},
    }))  # fmt: skip
    lines = script.mutation_scores(record).splitlines()
    assert lines[0] == "The full run recorded in `benchmarks/log/mutation.json`: tree abc1234, 2026-01-02."
    # score = (killed + timed out) / generated = 3 / 4
    assert "| cache | 4 | 2 | 1 | 0 | 1 | 0 | 0 | 0 | 75.0% |" in lines
    assert "| `infer_ref.cache.paged` | 4 | 2 | 1 | 0 | 1 | 0 | 0 | 0 | 75.0% |" in lines


def test_the_self_consistency_table_is_four_times_each_spread_at_least_the_floor_at_most_the_oracles(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    spreads = {("x", "float32"): 1e-5, ("y", "float16"): 0.1, ("z", "float32"): 0.0}
    monkeypatch.setattr(script, "MEASURED_SPREAD", spreads)
    monkeypatch.setattr(tolerances, "MEASURED_SPREAD", spreads)
    assert script.consistency_tolerances().splitlines()[2:] == [
        "| x, float32 | 1e-05 | 4e-05 |",  # 4 x 1e-5
        "| y, float16 | 0.1 | 0.15 (the agreement tolerance) |",  # 4 x 0.1 capped at float16's 0.15
        "| z, float32 | 0 | 1e-05 |",  # bit for bit: the floor
    ]


def _copy_pages(script: ModuleType, root: Path) -> None:
    """Every page with a generated block or a quoted constant, copied under ``root`` to be edited."""
    for page in script.pages():
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, root / page)


def test_a_block_that_no_longer_matches_its_results_is_named_stale(
    script: ModuleType, tmp_path: Path
) -> None:
    _copy_pages(script, tmp_path)
    page = tmp_path / "docs" / "engines.md"
    block = script.block_in(page, "engine-run-times")
    edited = block.replace("| infer_ref | ", "| infer_ref | 155 s; ")  # a typed figure, edited by hand
    page.write_text(page.read_text().replace(block, edited))
    assert script.stale_blocks(tmp_path) == ["docs/engines.md: engine-run-times"]


def test_a_tolerance_quoted_otherwise_than_the_code_defines_it_is_named(
    script: ModuleType, tmp_path: Path
) -> None:
    _copy_pages(script, tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("1e-9 (`EXACT_FLOAT64`", "1e-13 (`EXACT_FLOAT64`"))
    assert script.stale_blocks(tmp_path) == ["README.md: EXACT_FLOAT64 is 1e-9"]


def test_the_engine_matrix_page_and_picture_are_what_its_recorded_command_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = (ROOT / "docs" / "engines-matrix.md").read_text(encoding="utf-8")
    command = page.split("Generated by `", 1)[1].split("`", 1)[0]
    argv = shlex.split(command)[2:]  # after "python scripts/engine_matrix.py"
    monkeypatch.chdir(ROOT)
    assert draw_matrix([*argv, "--md", str(tmp_path / "m.md"), "--svg", str(tmp_path / "m.svg")]) == 0
    drawn = (tmp_path / "m.md").read_text(encoding="utf-8")
    # the page names its picture and the command that drew it; everything after that header is the results'
    assert drawn.split("\n", 3)[3] == page.split("\n", 3)[3], "redraw: " + command
    assert (tmp_path / "m.svg").read_text(encoding="utf-8") == (
        ROOT / "docs" / "engines-matrix.svg"
    ).read_text(encoding="utf-8")


def test_the_float64_tables_come_from_the_spread_record_naming_the_nearest_bug_and_the_unseen(
    script: ModuleType, tmp_path: Path
) -> None:
    rows = {
        "definition (every step float64)": {"llama": 0.0, "qwen3": 0.0},
        "norm in float32 (transformers)": {"llama": 2e-6, "qwen3": 4.04e-7},
        "infer_ref (control copy)": {"llama": 1.4e-14, "qwen3": 1.06e-14},
        "far_bug": {"llama": 12.0, "qwen3": float("inf")},
        "near_bug": {"llama": 1e-14, "qwen3": 0.5},
        "unseen_bug": {"llama": 1e-14, "qwen3": 1e-14},
    }
    record = tmp_path / "spread.json"
    record.write_text(json.dumps({"command": "python -m x --examples 2 --mutants", "examples": 2, "rows": rows}))
    lines = script.float64_spread(record).splitlines()
    assert "| infer_ref (the mutant machinery's control copy, through its cache) | 1.4e-14 | 1.1e-14 |" in lines
    assert "| norm in float32 (transformers) | 2.0e-6 | 4.0e-7 |" in lines
    assert "| nearest planted bug (`near_bug`; –: it does not show in that family) | – | 0.5 |" in lines
    assert "| every other planted bug of the model tier | 12 – 12 | ∞ – ∞ |" in lines
    assert any("`unseen_bug` does not show in a fresh float64 run" in line for line in lines)
    # 1e-4 / 2e-6 = 50; 0.5 / 1e-4 = 5000
    assert lines[-1] == ("| float64 with float32 intermediates | 1e-4 | 50× the largest float32-step spread (2.0e-6), "
                         "5,000× below the nearest planted bug (0.5) |")  # fmt: skip
