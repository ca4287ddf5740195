"""An engine's declared recipe differences (a legitimate recipe it uses on purpose, e.g. llama.cpp's
Gemma normaliser in float32) are checked against the legitimate ensemble, named in the report beside
their measured size, and drawn into docs/low-precision.md's generated block with every statistic in
spreads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infer_ref.conformance.engines.adapters.llamacpp import start_llamacpp
from infer_ref.conformance.engines.matrix import recipe_results
from infer_ref.conformance.engines.notes import recipe_difference_note
from infer_ref.conformance.engines.recipes import LEGITIMATE
from infer_ref.conformance.engines.session import EngineStartError, declared_recipe_differences


def _factory(**attrs: Any) -> Any:
    def start_mine() -> None: ...

    for name, value in attrs.items():
        setattr(start_mine, name, value)
    return start_mine


def test_a_factory_declaring_nothing_declares_no_difference() -> None:
    assert declared_recipe_differences(_factory()) == {}


def test_llamacpp_declares_its_float32_normaliser_a_legitimate_recipe() -> None:
    declared = declared_recipe_differences(start_llamacpp)
    assert set(declared) == {"embed_normaliser_float32"}
    assert "embed_normaliser_float32" in {r.name for r in LEGITIMATE}
    assert "21451" in declared["embed_normaliser_float32"]  # the tracker thread that says it is on purpose


def test_a_difference_that_is_no_legitimate_recipe_is_refused_by_name() -> None:
    # A recipe *bug* is not a difference an engine may declare away.
    factory = _factory(recipe_differences={"gemma_one_plus_w_low_precision": "mine", "canonical": "x"})
    with pytest.raises(EngineStartError) as e:
        declared_recipe_differences(factory)
    assert "gemma_one_plus_w_low_precision" in str(e.value)
    assert "embed_normaliser_float32" in str(e.value)  # the names it expected
    assert "canonical" not in str(e.value).split(": expected")[0]  # a legitimate name is not blamed


def _stat(spreads: float, t: float, judged: bool = True, deviates: bool = False) -> dict[str, Any]:
    return {"value": 0.0, "se": 1.0, "centre": 0.0, "spread": 1.0, "spreads": spreads, "t": t,
            "judged": judged, "deviates": deviates}  # fmt: skip


def _row(exceeded: list[str], differences: dict[str, str]) -> dict[str, Any]:
    slope_deviates = "slope" in exceeded
    return {
        "test": "test_recipe_statistics_within_calibrated_spread",
        "checkpoint": "gemma3-numerics-hidden304-t5",
        "dtype": "bfloat16",
        "positions": 1400,
        "exceeded": exceeded,
        "recipe_statistics": {
            "slope": _stat(4.0 if slope_deviates else 0.9, 21.0, deviates=slope_deviates),
            "chosen_error": _stat(-0.8, -19.0),
            "kl_mean": _stat(0.4, 2.0, judged=False),
        },
        "recipe_differences": differences,
    }


def test_the_note_names_the_difference_and_its_size_in_spreads() -> None:
    note = recipe_difference_note(_row([], {"embed_normaliser_float32": "kept in float32"}))
    assert note == (
        "recipe difference declared on gemma3-numerics-hidden304-t5 (bfloat16): embed_normaliser_float32 "
        "(kept in float32); measured: slope +0.9 spreads (t +21), chosen_error -0.8 spreads (t -19); "
        "within the margin"
    )
    beyond = recipe_difference_note(_row(["slope"], {"embed_normaliser_float32": "kept in float32"}))
    assert beyond.endswith(
        "slope +4.0 spreads (t +21), chosen_error -0.8 spreads (t -19); beyond the margin: slope"
    )


def test_the_generated_block_carries_each_reports_figures(tmp_path: Path) -> None:
    report = {"adapter": "engine tier: llama.cpp", "dtype": "bfloat16", "notes": ["engine: llama.cpp 0.3.36"],
              "totals": {"counts": {"passed": 1, "failed": 1, "xfailed": 0}},
              "distributions": [_row(["slope"], {"embed_normaliser_float32": "kept in float32"}),
                                {"test": "test_generated_logprobs_agree_with_oracle", "checkpoint": "llama-tiny"}]}  # fmt: skip
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "llama.cpp-bfloat16.json").write_text(json.dumps(report))
    doc = tmp_path / "page.md"
    doc.write_text(
        "before\n<!-- recipe-engines:start -->\nstale figures\n<!-- recipe-engines:end -->\nafter\n"
    )
    assert recipe_results.main(["--results", str(tmp_path / "results"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "stale figures" not in text
    assert "| `llama.cpp-bfloat16.json` | llama.cpp 0.3.36 | bfloat16 | 1 passed, 1 failed |" in text
    assert (
        "| llama.cpp 0.3.36 | bfloat16 | gemma3-numerics-hidden304-t5 | 1400 | **+4.0 (t +21)** | -0.8 (t -19) | "
        "(+0.4 (t +2)) | – | embed_normaliser_float32 (kept in float32) |"
    ) in text
    assert "llama-tiny" not in text  # a distribution row of another verdict is not the recipe verdict's


def test_the_generated_block_refuses_a_folder_without_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("<!-- recipe-engines:start -->\nkept\n<!-- recipe-engines:end -->\n")
    assert recipe_results.main(["--results", str(tmp_path), "--doc", str(doc)]) == 2
    assert "no report JSON" in capsys.readouterr().err
    assert "kept" in doc.read_text()  # the page is left as it was
