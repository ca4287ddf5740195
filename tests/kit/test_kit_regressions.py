"""One regression test per blind spot the kit had when pointed at engines other than infer_ref.

Each runs ``infer-ref conformance`` as a user would (a subprocess, from a directory outside the
checkout, with the adapters of ``kit_adapters.py``) and fails on the old behaviour.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conformance_run import HERE, ROOT, conformance, plugin_args
from hypothesis.vendor.pretty import pretty

import infer_ref.conformance.tests as shipped
from infer_ref.cli import main as infer_ref_main
from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.errors import EXIT_USAGE


@pytest.mark.kit_run
def test_the_kit_ships_in_the_package_and_runs_from_any_directory(tmp_path: Path) -> None:
    """Old: the suite ran only from a clone (tests/property), and the kit's self-tests counted as
    passes under any --ir-impl."""
    names = {p.name for p in Path(shipped.__file__).parent.glob("test_*.py")}
    assert {"test_cache.py", "test_masks.py", "test_model.py", "test_golden.py"} <= names
    assert not names & {"test_kit.py", "test_example_adapter.py", "test_kit_regressions.py"}
    run = conformance("infer_ref.conformance.adapters.reference:INFER_REF", "-k", "test_masks", cwd=tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    assert f"rootdir: {tmp_path}" in run.output
    assert run.report["totals"]["counts"]["passed"] == 14, run.report["totals"]
    assert set(run.report["by_capability"]) == {"mask"}


@pytest.mark.kit_run
def test_device_and_dtype_reach_every_adapter_call(tmp_path: Path) -> None:
    """Old: --ir-device was ignored, every call received cpu. The spy is asked for ``cpu:0`` and
    float32 and records what each make_cache / load_model call received."""
    log = tmp_path / "spy.jsonl"
    run = conformance(
        "kit_adapters:SPY", "--device", "cpu:0", "--dtype", "float32",
        "-k", "test_chunked_attention or (test_any_chunking and llama)", cwd=tmp_path, env={"KIT_SPY_LOG": str(log)},
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["call"] for c in calls} == {"make_cache", "load_model", "make_model_cache"}
    asked = [c for c in calls if c["call"] != "make_model_cache"]  # that one receives the model, not a device
    assert {(c["device"], c["dtype"]) for c in asked} == {("cpu:0", "torch.float32")}
    assert "device: cpu:0" in run.output and "dtype: float32" in run.output


@pytest.mark.kit_run
def test_derandomized_examples_do_not_depend_on_where_the_kit_is_installed(tmp_path: Path) -> None:
    """Old: Hypothesis keyed a parametrized property's derandomized examples by its pytest node id,
    which holds the path from the run's root directory to the installed package: from another
    checkout the ci/mutants profiles drew other examples, and an expected failure listed in an
    xfails file passed or failed with the checkout's location. The same kit at two locations must
    draw the same cases in the same order."""
    drawn = []
    for where in (tmp_path / "one", tmp_path / "two" / "deeper"):
        shutil.copytree(ROOT / "infer_ref", where / "infer_ref", ignore=shutil.ignore_patterns("__pycache__"))
        log = tmp_path / f"spy-{where.name}.jsonl"
        run = conformance(
            "kit_adapters:SPY", "-k", "test_any_chunking and qwen3", cwd=tmp_path, profile="mutants",
            env={"KIT_SPY_LOG": str(log), "PYTHONPATH": os.pathsep.join([str(where), str(HERE)])},
        )  # fmt: skip
        assert run.returncode == 0, run.output[-3000:]
        assert f"{where.relative_to(tmp_path)}/infer_ref" in run.output  # this copy ran
        drawn.append([c["what"] for c in map(json.loads, log.read_text().splitlines()) if c["call"] == "make_model_cache"])
    assert len(set(drawn[0])) > 3, drawn[0]  # several distinct examples were drawn
    assert drawn[0] == drawn[1]


@pytest.mark.kit_run
def test_a_cache_that_raises_and_corrupts_itself_is_reported_as_corrupting(tmp_path: Path) -> None:
    """Old: the exception type was checked first, so a cache that refused an overflow with a proper
    ValueError after writing half of it passed. Now the state is checked first."""
    run = conformance("kit_adapters:CORRUPTS_THEN_RAISES", "-k", "test_error_case and capacity", cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-3000:]
    assert "layer lengths [8, 8] after the refused call (write past capacity), expected 3" in run.output, run.output[-3000:]


@pytest.mark.kit_run
def test_a_cache_that_validates_nothing_is_skipped_not_failed_on_errors(tmp_path: Path) -> None:
    """Old: a cache whose positions belong to its caller failed every error case. Declaring
    ``validates=False`` skips them as "does not validate"; every other cache property still runs."""
    run = conformance("kit_adapters:CALLER_OWNED", "-k", "test_cache", cwd=tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    errors = run.report["by_capability"]["cache.errors"]["counts"]
    assert errors["not supported"] == 17 and errors["passed"] == errors["failed"] == 0
    assert run.report["by_capability"]["cache"]["counts"]["passed"] == 5
    assert "does not validate" in run.report["capabilities"]["cache.errors"]


@pytest.mark.kit_run
def test_self_consistency_is_judged_exactly_apart_from_transformers(tmp_path: Path) -> None:
    """Old: an implementation 1e-7 off transformers (an RMSNorm cast in another order) never had
    its cached path compared. Now the cached path is held to 1e-9 against its own full forward.
    (1e-7 is the float32-intermediates tier: ``--strict-float64`` makes the transformers tests fail.)"""
    run = conformance(
        "kit_adapters:SLIGHTLY_OFF", "-k", "llama and (test_full_forward or test_any_chunking or test_decode_across)",
        "--strict-float64", cwd=tmp_path, profile="mutants",
    )
    assert run.returncode == 1, run.output[-3000:]
    oracles = run.report["by_oracle"]
    assert oracles["transformers"]["counts"]["failed"] == 2, oracles
    assert oracles["self-consistency"]["counts"] == {**oracles["self-consistency"]["counts"], "passed": 2, "failed": 0}


@pytest.mark.kit_run
def test_stale_xfail_entries_fail_the_run(tmp_path: Path) -> None:
    """Old: a stale entry was a warning and an unexpected pass an XPASS; both now fail the run. An
    entry whose test ``-k`` leaves out is not stale (it was reported so, failing selected runs)."""
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        "test_masks.py::test_boundary_cases[1-0-None]  # passes: XPASS(strict)\n"
        "test_masks.py::test_gone\n"
        "test_masks.py::test_mask_is_the_definition  # left out by -k: not run, so not stale either\n"
    )
    run = conformance("infer_ref.conformance.adapters.reference:INFER_REF", "-k", "test_boundary_cases", "--xfails", str(xfails), cwd=tmp_path)
    assert run.returncode == 1, run.output[-3000:]
    assert "XPASS(strict)" in run.output
    assert run.report["stale_xfails"] == ["test_masks.py::test_gone"]


def test_golden_verify_takes_any_adapter(capsys: object) -> None:
    """Old: ``infer-ref golden verify`` judged only infer_ref or transformers."""
    path = str(ROOT / "fixtures" / "golden" / "llama-tiny.cpu-float32.json")
    assert infer_ref_main(["golden", "verify", path, "--impl", "examples.naive_cache_adapter:ADAPTER", "--quiet"]) == 0
    assert infer_ref_main(["golden", "verify", path, "--impl", "infer_ref.conformance.mutants:rope_no_offset", "--quiet"]) == 1
    # An adapter that cannot verify golden files (no make_model_cache / forward) is a usage error.
    assert infer_ref_main(["golden", "verify", path, "--impl", "examples.ring_buffer_adapter:ADAPTER", "--quiet"]) == EXIT_USAGE


def test_a_failure_names_the_adapter_instead_of_printing_it() -> None:
    """Old: Hypothesis' falsifying example printed every field of the Adapter dataclass."""
    assert pretty(INFER_REF) == "Adapter('infer_ref')"


def test_xfail_conditions_select_entries_by_package_version_and_device(tmp_path: Path) -> None:
    """A behaviour fixed in a later release (or only seen on a GPU) is listed once, with conditions:
    where they do not hold the entry does not apply, so it is never reported stale there."""
    import pytest as _pytest

    from infer_ref.conformance.xfail_files import read_xfails

    f = tmp_path / "xfails.txt"
    f.write_text(
        "test_cache.py::test_a[write past capacity]  # a parameter id with spaces, no condition\n"
        "test_cache.py::test_b [pytest<1.0]  # pytest is newer than 1.0: does not apply\n"
        "test_cache.py::test_c [pytest>=1.0]  # applies\n"
        "test_cache.py::test_d [cuda]  # only on a GPU\n"
        "test_cache.py::test_e [cpu] [pytest>=1.0]  # both hold on the CPU\n"
        "test_cache.py::test_f [no-such-package-xyz>=1]  # not installed: does not apply\n"
    )
    assert read_xfails(f, "cpu") == [
        "test_cache.py::test_a[write past capacity]",
        "test_cache.py::test_c",
        "test_cache.py::test_e",
    ]
    assert read_xfails(f, "cuda:1") == [
        "test_cache.py::test_a[write past capacity]",
        "test_cache.py::test_c",
        "test_cache.py::test_d",
    ]
    bad = tmp_path / "bad.txt"
    bad.write_text("test_cache.py::test_a [float31]\n")
    with _pytest.raises(_pytest.UsageError, match=r"bad.txt:1: condition \[float31\] is neither \[cuda\], \[cpu\], a dtype"):
        read_xfails(bad)
    bad.write_text("test_cache.py::test_a [transformers~5]\n")
    with _pytest.raises(_pytest.UsageError, match=r"bad.txt:1: condition \[transformers~5\]"):
        read_xfails(bad)


def test_an_entry_that_may_pass_is_an_expected_failure_that_is_not_strict(tmp_path: Path) -> None:
    """A difference that crosses the tolerance on some CPUs only (llama.cpp's rounding follows the
    SIMD path it was built for) is listed ``[may pass]``: an expected failure where it shows, a pass
    where it does not, never an unexpected pass that fails the run. Its conditions still apply."""
    from infer_ref.conformance.xfail_files import read_xfails, xfail_entries

    f = tmp_path / "xfails.txt"
    f.write_text(
        "test_a.py::test_strict[x]\n"
        "test_a.py::test_split[gemma3-t [float32] [may pass]  # the CPU decides\n"
        "test_a.py::test_other [may pass] [float16]\n"
    )
    assert xfail_entries(f, "cpu", "float32") == [("test_a.py::test_strict[x]", True), ("test_a.py::test_split[gemma3-t", False)]
    assert xfail_entries(f, "cpu", "float16") == [("test_a.py::test_strict[x]", True), ("test_a.py::test_other", False)]
    assert read_xfails(f, "cpu", "float32") == ["test_a.py::test_strict[x]", "test_a.py::test_split[gemma3-t"]


def test_a_may_pass_entry_that_passes_counts_as_passed_and_a_strict_xpass_as_failed() -> None:
    from types import SimpleNamespace

    from infer_ref.conformance.report import outcome_of

    # pytest's reports: a non-strict XPASS passes and keeps wasxfail; an expected failure is skipped
    # with wasxfail; a strict XPASS fails without it.
    xpass = SimpleNamespace(when="call", passed=True, skipped=False, failed=False, wasxfail="listed [may pass]")
    xfail = SimpleNamespace(when="call", passed=False, skipped=True, failed=False, wasxfail="listed")
    strict_xpass = SimpleNamespace(when="call", passed=False, skipped=False, failed=True, longrepr="[XPASS(strict)] listed")
    assert [outcome_of(r) for r in (xpass, xfail, strict_xpass)] == ["passed", "xfailed", "failed"]  # type: ignore[arg-type]


def test_xfail_conditions_select_entries_by_the_dtype_under_test(tmp_path: Path) -> None:
    """An entry seen only at one precision (a self-consistency spread that a float16 tolerance
    covers) applies at that dtype alone; read back without a dtype, as for stored results, a
    dtype condition does not hold."""
    from infer_ref.conformance.xfail_files import read_xfails

    f = tmp_path / "xfails.txt"
    f.write_text("test_a [float32]\ntest_b [float16] [cpu]\ntest_c\n")
    assert read_xfails(f, "cpu", "float32") == ["test_a", "test_c"]
    assert read_xfails(f, "cpu", "float16") == ["test_b", "test_c"]
    assert read_xfails(f, "cuda:0", "float16") == ["test_c"]
    assert read_xfails(f, "cpu") == ["test_c"]


def test_failures_after_a_cuda_device_side_assert_are_labelled_as_its_consequence(tmp_path: Path) -> None:
    """After a device-side assert every CUDA call of the process fails: the kit names the test that
    lost the context and labels the later failures, instead of reporting each as its own finding."""
    import json
    import subprocess
    import sys

    (tmp_path / "test_lost.py").write_text(
        "import pytest\n"
        "@pytest.mark.ir_requires('cache')\n"
        "def test_1_asserts():\n"
        "    raise RuntimeError('CUDA error: device-side assert triggered')\n"
        "@pytest.mark.ir_requires('cache')\n"
        "def test_2_after():\n"
        "    raise RuntimeError('CUDA error: device-side assert triggered (reported late)')\n"
        "@pytest.mark.ir_requires('cache')\n"
        "def test_3_passes():\n"
        "    pass\n"
    )
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *plugin_args(), "-q", "test_lost.py", f"--ir-report={report}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["totals"]["counts"]["failed"] == 2 and data["totals"]["counts"]["passed"] == 1
    notes = "\n".join(data["notes"])
    assert "test_lost.py::test_1_asserts hit a CUDA device-side assert" in notes
    assert "1 failure(s) came after a CUDA device-side assert" in notes
    assert "the CUDA context of this process was lost in test_lost.py::test_1_asserts" in proc.stdout


def _kit_without_checkout(tmp_path: Path) -> Path:
    """The kit as an installed wheel has it: the package alone, no fixtures/ beside it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "infer_ref", site / "infer_ref", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_an_engine_without_model_dir_outside_a_checkout_is_one_usage_line(tmp_path: Path) -> None:
    """Old: ``infer-ref conformance --engine ...`` from an installed kit, without --model-dir, ended
    in pytest's INTERNALERROR (NotSetType) once collection found no checkpoint folder; the message
    meant for it was lost. Now the command refuses it before pytest starts."""
    site = _kit_without_checkout(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", "my_engine:start"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stderr
    assert "without --model-dir judges the kit's own checkpoints" in proc.stderr and "pass --model-dir DIR" in proc.stderr


@pytest.mark.kit_run
def test_the_engine_tier_under_pytest_without_checkpoints_is_a_usage_error(tmp_path: Path) -> None:
    """The same through pytest itself (the plugin's options): refused when pytest configures, before
    collection, with the option to pass."""
    site = _kit_without_checkout(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(),
         "--pyargs", "infer_ref.conformance.engines.tests", "--ir-engine=infer_ref"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4 and "INTERNALERROR" not in output, output[-3000:]
    assert "no checkpoints to judge: pass --ir-model-dir DIR" in output, output[-3000:]
