"""The float64 tier's three verdicts, earned through ``infer-ref conformance`` as a user runs it.

``examples/norm_precision_adapters.py`` holds two outside-style decoders that differ from infer_ref
in their RMSNorm only: one wholly in float64 (exact float64), one with litgpt's float32 weight
multiply (float64 with float32 intermediates: passes with precision notes, fails under
``--strict-float64``). A planted bug is wrong. Both transformers comparisons of the model tier run
(full forward, and prefill + decode across windows, every family).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_run import conformance

from infer_ref.conformance import blame, tiers

AGAINST_TRANSFORMERS = ("-k", "test_full_forward_matches_transformers or test_decode_across_windows_matches_transformers")


@pytest.mark.kit_run
def test_norms_wholly_in_float64_are_exact(tmp_path: Path) -> None:
    run = conformance("examples.norm_precision_adapters:FLOAT64_NORMS", *AGAINST_TRANSFORMERS, cwd=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert run.report["totals"]["counts"]["passed"] == 6, run.report["totals"]
    assert (run.report["verdict"], run.report["precision_tests"]) == (tiers.EXACT, 0), run.report["precision_notes"]


@pytest.mark.kit_run
def test_litgpt_weight_multiply_passes_with_a_precision_note(tmp_path: Path) -> None:
    run = conformance("examples.norm_precision_adapters:LITGPT_NORMS", *AGAINST_TRANSFORMERS, cwd=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert run.report["verdict"] == tiers.FLOAT32_STEPS, run.report
    assert run.report["precision_tests"] == 6, run.report["precision_notes"]
    assert tiers.FLOAT32_STEPS in run.report["precision_notes"][0]
    assert f"tests passed** ({tiers.FLOAT32_STEPS})" in run.output  # the printed report says it too


@pytest.mark.kit_run
def test_litgpt_weight_multiply_fails_under_strict_float64(tmp_path: Path) -> None:
    run = conformance(
        "examples.norm_precision_adapters:LITGPT_NORMS", "-k", "test_full_forward_matches_transformers",
        "--strict-float64", cwd=tmp_path, profile="mutants",
    )
    assert run.returncode == 1, run.output[-4000:]
    assert run.report["verdict"] == tiers.WRONG and run.report["totals"]["counts"]["failed"] == 3, run.report["totals"]
    assert "failed because --strict-float64 was given" in run.output
    # The rounding is blamed on no bug class: every follow-up probe passes (at the float32 tolerance).
    assert {b["verdict"] for b in run.report["blame"].values()} == {blame.NOT_IMPLICATED}, run.report["blame"]
    assert blame.NO_PROBE_FAILS in run.report["notes"]


@pytest.mark.kit_run
def test_a_planted_bug_is_wrong(tmp_path: Path) -> None:
    run = conformance("infer_ref.conformance.mutants:v_rotated", "-k", "test_full_forward_matches_transformers", cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-4000:]
    assert run.report["verdict"] == tiers.WRONG and run.report["precision_tests"] == 0, run.report
    assert f"[{tiers.WRONG}: beyond the {tiers.FLOAT32_INTERMEDIATES:g}" in run.output
    # The failed test guards six classes; the follow-up probes blame the one planted.
    verdicts = {name: b["verdict"] for name, b in run.report["blame"].items()}
    assert verdicts.pop("V rotated by RoPE") == blame.IMPLICATED, run.report["blame"]
    assert len(verdicts) == 5 and set(verdicts.values()) == {blame.NOT_IMPLICATED}, run.report["blame"]
    assert "**implicated**: V rotated by RoPE" in run.output


def test_verdict_of_a_report() -> None:
    """float64: exact unless a test reached only the middle tier; any failure: wrong; other dtypes
    and the engine tier (its own tolerances) never claim a float64 tier."""
    from infer_ref.conformance.report import Report, verdict_of

    report = Report(impl="x", adapter="a", version="1", device="cpu", dtype="float64", capabilities={})
    report.totals.counts["passed"] = 5
    assert verdict_of(report) == tiers.EXACT
    report.precision_tests = 2
    assert verdict_of(report) == tiers.FLOAT32_STEPS
    report.totals.counts["failed"] = 1
    assert verdict_of(report) == tiers.WRONG
    engine = Report(impl="x", adapter="engine tier:", version="vllm", device="the engine's", dtype="float64", capabilities={})
    engine.totals.counts["passed"] = 5
    assert verdict_of(engine) == "within the float64 tolerances"
    bf16 = Report(impl="x", adapter="a", version="1", device="cuda", dtype="bfloat16", capabilities={})
    bf16.totals.counts["passed"] = 5
    assert verdict_of(bf16) == "within the bfloat16 tolerances"


# The documented example commands (docs/conformance.md §4), read from the page and run as written:
# the verdict each promises in its comment is the one it must give ("fails": exit 1, wrong).
DOCUMENTED = {"exact float64": (0, tiers.EXACT), "float64 with float32 intermediates": (0, tiers.FLOAT32_STEPS),
              "fails": (1, tiers.WRONG)}  # fmt: skip


def _documented_commands() -> list[tuple[list[str], str]]:
    page = (Path(__file__).resolve().parents[2] / "docs" / "conformance.md").read_text()
    found = []
    for line in page.splitlines():
        command, _, promise = line.partition("#")
        if command.startswith("infer-ref conformance --impl examples.norm_precision_adapters:"):
            found.append((command.split()[2:], promise.strip()))
    return found


def test_the_page_documents_each_verdict_once() -> None:
    assert sorted(promise for _, promise in _documented_commands()) == sorted(DOCUMENTED)


@pytest.mark.kit_run
@pytest.mark.parametrize(("args", "promise"), [pytest.param(a, p, id=p) for a, p in _documented_commands()])
def test_each_documented_command_gives_the_verdict_it_promises(args: list[str], promise: str, tmp_path: Path) -> None:
    """Old: the LITGPT_NORMS command the page promises "float64 with float32 intermediates" gave
    **wrong**: the engine test compared with transformers at 1e-9, outside the three-tier verdict."""
    impl, rest = args[1], args[2:]
    code, verdict = DOCUMENTED[promise]
    # A failing run is judged without shrinking (the mutants profile: the same verdict, minutes sooner).
    run = conformance(impl, *rest, cwd=tmp_path, profile="mutants" if code else "dev")
    assert (run.returncode, run.report.get("verdict")) == (code, verdict), run.output[-4000:]
