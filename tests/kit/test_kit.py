"""Self-checks of the conformance kit: the mutant registry, the mutant machinery, the assertions,
the xfail file reader and the adapter loader. These test the kit, not the implementation under
test, so they run once whatever ``--ir-impl`` says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import case_models
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.conformance.assertions import assert_close, assert_tokens_equal, assert_visibility
from infer_ref.conformance.checkpoints.snapshots import FAMILIES
from infer_ref.conformance.interface.adapter import DEFAULT_IMPL, Adapter, load_adapter
from infer_ref.conformance.mutants import ALL_BUG_CLASSES, BUG_CLASSES, CONTROL, MUTANTS
from infer_ref.conformance.xfail_files import matches, read_xfails

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def design_bug_classes() -> list[str]:
    """The "·"-separated list of docs/design.md's "Bug classes the suite must catch" section."""
    section = DESIGN.read_text().split("## Bug classes the suite must catch", 1)[1]
    listed = section.split("(real incidents in public engines):", 1)[1].split("\n\n", 1)[0]
    return [" ".join(c.split()).rstrip(".") for c in listed.split("·")]


def test_every_design_bug_class_has_a_mutant() -> None:
    """The list in docs/design.md ("Bug classes the suite must catch"), each with at least one mutant."""
    assert list(BUG_CLASSES) == design_bug_classes()
    covered = {m.bug_class for m in MUTANTS.values()}
    assert covered == set(ALL_BUG_CLASSES), sorted(set(ALL_BUG_CLASSES) ^ covered)


def test_each_mutant_is_a_selectable_adapter() -> None:
    for name, mutant in MUTANTS.items():
        adapter = load_adapter(f"infer_ref.conformance.mutants:{name}")
        assert adapter.name == name
        assert mutant.targets, name
        assert adapter.capabilities() == mutant.judged_like.capabilities(), (name, adapter.capabilities())


def test_mutant_docs_are_in_the_conformance_guide() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "conformance.md").read_text()
    for name in MUTANTS:
        assert f"`{name}`" in doc, f"{name} missing from docs/conformance.md: rerun python -m infer_ref.conformance.mutants --write-table docs/conformance.md"


@pytest.mark.parametrize("family", FAMILIES)
@given(case=st.data())
def test_control_copy_equals_infer_ref_bit_for_bit(family: str, case: st.DataObject) -> None:
    """With every knob at its default, the mutant machinery's copies of the model code give exactly
    infer_ref's logits, cached and uncached: each mutant differs from infer_ref by its bug alone."""
    mc = case.draw(irst.model_configs(family))
    ids = case.draw(irst.token_ids(mc.hf_config["vocab_size"], 1, 12))
    ref, ctl = case_models.load(INFER_REF, mc), case_models.load(CONTROL, mc)
    assert INFER_REF.forward is not None and INFER_REF.make_model_cache is not None
    assert CONTROL.make_model_cache is not None
    assert torch.equal(INFER_REF.forward(ref, ids, None), INFER_REF.forward(ctl, ids, None))
    c1, c2 = INFER_REF.make_model_cache(ref, 12, 1), CONTROL.make_model_cache(ctl, 12, 1)
    for s, e in ((0, 5), (5, 6), (6, 12)):
        assert torch.equal(INFER_REF.forward(ref, ids[:, s:e], c1), INFER_REF.forward(ctl, ids[:, s:e], c2))


def test_assert_close_reports_position_values_params_and_repro() -> None:
    a = torch.zeros(2, 3, dtype=torch.float64)
    b = a.clone()
    b[1, 2] = 0.5
    with pytest.raises(AssertionError) as err:
        assert_close(a, b, what="logits", params={"chunks": [2, 1]})
    msg = str(err.value)
    assert "first differing position (1, 2)" in msg
    assert "expected 0.5" in msg
    assert "chunks = [2, 1]" in msg
    assert re.search(r"repro: pytest \S+test_kit.py::test_assert_close", msg)
    with pytest.raises(AssertionError, match=r"shape \(2, 3\) != expected \(3,\)"):
        assert_close(a, torch.zeros(3), what="x")


def test_assert_visibility_and_tokens_name_the_first_difference() -> None:
    want = torch.tensor([[True, False], [True, True]])
    got = torch.tensor([[True, True], [True, True]])
    with pytest.raises(AssertionError, match=r"query 0 \(position 0\) sees key 1"):
        assert_visibility(got, want, q_len=2, start=0, window=None)
    with pytest.raises(AssertionError, match="tokens differ at step 2"):
        assert_tokens_equal([1, 2, 3], [1, 2, 4], what="greedy")


def test_xfail_file_reader_and_matching(tmp_path: Path) -> None:
    f = tmp_path / "xfails.txt"
    f.write_text("# known problems\n\ninfer_ref/conformance/tests/test_cache.py::test_reset  # reset is lazy\ntest_masks.py::test_boundary_cases[1-0-1]\n")
    entries = read_xfails(f)
    assert entries == ["infer_ref/conformance/tests/test_cache.py::test_reset", "test_masks.py::test_boundary_cases[1-0-1]"]
    assert matches("infer_ref/conformance/tests/test_cache.py::test_reset_restarts_at_zero", entries[0])
    assert matches("infer_ref/conformance/tests/test_masks.py::test_boundary_cases[1-0-1]", entries[1])
    assert not matches("infer_ref/conformance/tests/test_masks.py::test_boundary_cases[1-0-None]", entries[1])


def test_load_adapter_errors_are_usage_messages() -> None:
    assert load_adapter(DEFAULT_IMPL) is INFER_REF
    assert load_adapter("infer_ref.conformance.adapters.reference") is INFER_REF  # module alone: its ADAPTER
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        load_adapter("no_such_module:X")
    with pytest.raises(ValueError, match="has no attribute 'NOPE'"):
        load_adapter("infer_ref.conformance.adapters.reference:NOPE")
    with pytest.raises(ValueError, match="expected an infer_ref.conformance.interface.adapter.Adapter"):
        load_adapter("infer_ref.conformance.interface.adapter:DEFAULT_IMPL")


def test_capabilities_report_what_is_missing() -> None:
    caps = Adapter(name="mask-only", attention_mask=lambda q, s, w: None).capabilities()
    assert caps["mask"] is None
    assert caps["cache"] == "adapter has no make_cache, read_cache"
    assert caps["model"] is not None and "load_model" in caps["model"]


@pytest.mark.slow
def test_every_mutant_is_caught() -> None:
    """The planted-bug meta-check (about 6 CPU-minutes): the suite fails on every mutant."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "infer_ref.conformance.mutants", "--jobs", "2"], cwd=root, env=env, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(MUTANTS)}/{len(MUTANTS)} mutants caught" in proc.stdout


def test_each_xdist_worker_takes_its_own_gpu_round_robin() -> None:
    """``-n 8`` on a 2-GPU runner: gw0..gw7 -> cuda:0, 1, 0, 1, ...; explicit devices and CPUs untouched."""
    from infer_ref.conformance.plugin import worker_device

    assert [worker_device("cuda", f"gw{i}", 2) for i in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert worker_device("cuda", None, 2) == "cuda"
    assert worker_device("cuda:1", "gw0", 2) == "cuda:1"
    assert worker_device("cpu", "gw3", 2) == "cpu"
