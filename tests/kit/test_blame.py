"""The report's blame: bug classes narrowed by follow-up probes (``infer_ref.conformance.blame``).

The inference is checked on hand-made probe outcomes whose right answer follows from the table in
``blame/signatures.py``; the probes themselves are checked on infer_ref (every probe passes, at
float64 rounding) and on planted bugs, each of which must be blamed on its own class and no other.
The end-to-end run through ``infer-ref conformance`` is in ``test_float64_verdicts.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from infer_ref.conformance import blame, tiers
from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.conformance.blame import signatures as sig
from infer_ref.conformance.blame.probes import ProbeResult, Runner
from infer_ref.conformance.blame.suite import PROBE_NAMES, PROBES, run_probes
from infer_ref.conformance.mutants import ALL_BUG_CLASSES, BUG_CLASSES, MUTANTS
from infer_ref.conformance.profiles import one_torch_thread

FULL_GUARDS = [sig.V_ROTATED, sig.QK_NORM, sig.SCALE, sig.LLAMA3, sig.OFF_BY_ONE, sig.ONE_WINDOW]


def result(name: str, failed: bool, family: str = "gemma3_text", windowed: bool = True, **extra: str) -> ProbeResult:
    return ProbeResult(name, family, failed, 0.5 if failed else 1e-15, windowed, **extra)  # type: ignore[arg-type]


def outcomes(failing: set[str], family: str = "gemma3_text") -> list[ProbeResult]:
    """Every probe of the table, failing exactly those in ``failing`` (window crossings as on the probe case)."""
    unwindowed = {sig.FULL_NO_WINDOW, sig.DECODE_NO_WINDOW, sig.CHUNKS_NO_WINDOW, sig.CACHE_LENGTH}
    names = [probe.name for probe in PROBES if probe.applies(family)]
    return [result(n, n in failing, family, windowed=family == "gemma3_text" and n not in unwindowed) for n in names]


def test_the_table_names_known_classes_and_probes() -> None:
    assert set(sig.SIGNATURES) == set(BUG_CLASSES)
    for name, s in sig.SIGNATURES.items():
        assert not s.always & s.never, name
        assert (s.always | s.never) <= set(PROBE_NAMES), (name, (s.always | s.never) - set(PROBE_NAMES))


def test_one_failing_probe_pattern_implicates_its_class_and_clears_the_rest() -> None:
    """V rotated: the repeated token fails, and so does every full forward; nothing cached fails."""
    failing = {sig.REP, sig.REP_CACHED, sig.FULL} | set(sig.FULL_VARIANTS)
    findings, note = blame.narrow({"test_full[gemma3_text]": FULL_GUARDS}, outcomes(failing))
    assert note is None
    assert findings[sig.V_ROTATED].verdict == blame.IMPLICATED
    assert {c for c, f in findings.items() if f.verdict == blame.NOT_IMPLICATED} == set(FULL_GUARDS) - {sig.V_ROTATED}
    assert "repeated token" in findings[sig.QK_NORM].why  # ruled out by a probe it cannot fail


def test_a_passing_variant_singles_out_the_feature_it_neutralises() -> None:
    """Only the scalar = head_dim variant passes: the attention scale."""
    failing = {sig.FULL, sig.FULL_NO_WINDOW, sig.FULL_ALL_SLIDING, sig.FULL_UNIT_QK}
    findings, _ = blame.narrow({"test_full[gemma3_text]": FULL_GUARDS}, outcomes(failing))
    assert [c for c, f in findings.items() if f.verdict == blame.IMPLICATED] == [sig.SCALE]
    assert "full forward, scalar = head_dim" in findings[sig.QK_NORM].why


def test_a_class_the_family_lacks_is_not_implicated() -> None:
    findings, _ = blame.narrow({"test_full[qwen3]": [sig.LLAMA3, sig.QK_NORM]}, outcomes({sig.FULL, sig.FULL_UNIT_QK}, "qwen3"))
    assert findings[sig.LLAMA3].verdict == blame.NOT_IMPLICATED and "llama3 RoPE scaling" in findings[sig.LLAMA3].why
    assert findings[sig.QK_NORM].verdict == blame.IMPLICATED


def test_a_test_guarding_one_class_implicates_it_when_no_probe_can_see_it() -> None:
    """Cache reset and classes outside the model (sampling) have no probe: a failed test that guards
    nothing else still names them."""
    findings, note = blame.narrow({"test_reset[llama]": [sig.NOT_RESET]}, outcomes(set(), "llama"))
    assert note is None and findings[sig.NOT_RESET].verdict == blame.IMPLICATED
    sampling = ALL_BUG_CLASSES[-1]
    findings, _ = blame.narrow({"test_sampler": [sampling]}, [])
    assert findings[sampling].verdict == blame.IMPLICATED


def test_survivors_the_probes_cannot_separate_stay_possible() -> None:
    """Without probes, two classes of one failed test are both possible, neither implicated."""
    findings, _ = blame.narrow({"test_chunks": [sig.TOP_LEFT, sig.UNWRITTEN]}, [])
    assert {f.verdict for f in findings.values()} == {blame.POSSIBLE}
    assert sig.UNWRITTEN in findings[sig.TOP_LEFT].why


def test_no_probe_failing_says_the_failure_is_none_of_the_classes() -> None:
    """A rounding difference failed under --strict-float64: the probes (at the float32-intermediates
    tolerance) all pass, so every guarded class is ruled out and the report says why."""
    findings, note = blame.narrow({"test_full[llama]": FULL_GUARDS}, outcomes(set(), "llama"))
    assert note == blame.NO_PROBE_FAILS
    assert {f.verdict for f in findings.values()} == {blame.NOT_IMPLICATED}


def test_outcomes_no_single_class_explains_keep_only_sound_exclusions() -> None:
    """V rotated's pattern, and the one-position probe failing too, which no attention bug can: two
    bugs (or one outside the catalogue). Only classes a passing probe rules out are cleared; V
    rotated, whose every always-failing probe failed, stays possible."""
    failing = {sig.ONE, sig.REP, sig.REP_CACHED, sig.FULL} | set(sig.FULL_VARIANTS)
    guards = {"test_full[gemma3_text]": FULL_GUARDS, "test_chunks[gemma3_text]": [sig.TOP_LEFT, sig.ROPE_OFFSET]}
    findings, note = blame.narrow(guards, outcomes(failing))
    assert note == blame.NO_SINGLE_CLASS
    assert findings[sig.V_ROTATED].verdict == blame.POSSIBLE
    assert findings[sig.ROPE_OFFSET].verdict == blame.NOT_IMPLICATED  # 'decode' passes, which it always fails
    assert findings[sig.TOP_LEFT].verdict == blame.NOT_IMPLICATED  # 'chunks' passes, likewise


def test_refused_probes_give_no_evidence_and_raising_ones_fail() -> None:
    refused = result(sig.REP, False, error="refused: no float64")
    findings, _ = blame.narrow({"t": [sig.V_ROTATED, sig.SCALE]}, [refused, result(sig.FULL_SCALAR, True)])
    assert findings[sig.V_ROTATED].verdict == blame.IMPLICATED  # the refusal did not clear it
    raised = ProbeResult(sig.CACHE_LENGTH, "llama", True, math.inf, False, raised="ValueError: advance past capacity")
    findings, _ = blame.narrow({"t": [sig.ADVANCE, sig.ROPE_OFFSET]}, [raised])
    assert findings[sig.ADVANCE].verdict == blame.IMPLICATED and "raised ValueError" in findings[sig.ADVANCE].why


def test_probe_families_follow_the_failed_ids() -> None:
    families = ("llama", "qwen3", "gemma3_text")
    assert blame.probe_families({"t.py::test_full[gemma3_text]": []}, families) == ["gemma3_text"]
    assert blame.probe_families({"t.py::test_masks[3-4-4]": []}, families) == list(families)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    yield from one_torch_thread()


def test_infer_ref_passes_every_probe_at_float64_rounding(one_thread: None) -> None:
    """On the reference every probe passes by rounding alone (1e-14 measured), so a passing probe
    means something; q-norm ignored passes by moving (its distance is how far doubling moved it)."""
    runner = Runner(INFER_REF, "cpu")
    for family in ("llama", "qwen3", "gemma3_text"):
        for r in run_probes(runner, family):
            assert not r.failed and r.error is None and r.raised is None, r.describe()
            if r.name != sig.Q_NORM_IGNORED:
                assert r.distance < 1e-12, r.describe()
            else:
                assert r.distance > tiers.FLOAT32_INTERMEDIATES, r.describe()


MODEL_MUTANTS = [m for m in MUTANTS.values() if m.bug_class in sig.SIGNATURES and not all(
    s == "never" for s in [sig.SIGNATURES[m.bug_class].sign(p, "gemma3_text", True) for p in PROBE_NAMES]
)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MODEL_MUTANTS, ids=lambda m: m.name)
def test_each_planted_model_bug_is_blamed_on_its_class_alone(mutant: object, one_thread: None) -> None:
    """Every model-level class a failed test might guard is a candidate; the probes must leave the
    planted bug's class implicated and every other not implicated."""
    from infer_ref.conformance.mutants import Mutant

    assert isinstance(mutant, Mutant)
    family = {sig.LLAMA3: "llama"}.get(mutant.bug_class, "gemma3_text")
    results = run_probes(Runner(mutant.adapter, "cpu"), family)
    findings, note = blame.narrow({"every model class": list(sig.SIGNATURES)}, results)
    implicated = [c for c, f in findings.items() if f.verdict == blame.IMPLICATED]
    assert (implicated, note) == ([mutant.bug_class], None), [r.describe() for r in results if r.failed]
    assert all(f.verdict == blame.NOT_IMPLICATED for c, f in findings.items() if c != mutant.bug_class)


def test_a_passing_test_that_checks_a_class_alone_clears_it_unless_probes_judge_it() -> None:
    """The FCFS test (guarding both scheduling classes) failed, the batch-limit test passed: the
    batch limit is not implicated, and requeueing is the only class left. A model-level class is
    never cleared this way: a passing component test says nothing of the model."""
    limit, requeue = "more sequences running than the batch limit", "preempted request requeued behind new arrivals"
    findings, note = blame.narrow({"test_fcfs": [requeue, limit]}, [], {"test_limit[x]": [limit]})
    assert note is None
    assert findings[limit].verdict == blame.NOT_IMPLICATED and "test_limit[x]" in findings[limit].why
    assert findings[requeue].verdict == blame.IMPLICATED
    findings, _ = blame.narrow({"test_fcfs": [requeue, limit]}, [], {"test_limit[x]": [limit], "test_limit[y]": [limit]} | {})
    assert findings[limit].verdict == blame.NOT_IMPLICATED
    findings, _ = blame.narrow({"test_fcfs": [requeue, limit], "test_limit[y]": [limit]}, [], {"test_limit[x]": [limit]})
    assert findings[limit].verdict == blame.IMPLICATED  # another case of the same test failed
    findings, _ = blame.narrow({"test_full": [sig.V_ROTATED, sig.SCALE]}, [], {"test_masks": [sig.V_ROTATED]})
    assert findings[sig.V_ROTATED].verdict == blame.POSSIBLE


def test_a_failed_case_of_a_family_without_the_feature_clears_a_family_only_class() -> None:
    rms, gemma_w = "RMSNorm accumulated or scaled in low precision", "Gemma's 1 + w formed in low precision"
    node = "test_low_precision.py::test_final_norm_is_its_definition_in_low_precision"
    both = [rms, gemma_w]
    findings, _ = blame.narrow({f"{node}[llama-torch.bfloat16]": both, f"{node}[gemma3_text-torch.bfloat16]": both}, [])
    assert findings[gemma_w].verdict == blame.NOT_IMPLICATED and "llama" in findings[gemma_w].why
    assert findings[rms].verdict == blame.IMPLICATED
    findings, _ = blame.narrow({f"{node}[gemma3_text-torch.bfloat16]": both}, [])  # Gemma alone: not separated
    assert findings[gemma_w].verdict == blame.POSSIBLE and findings[rms].verdict == blame.POSSIBLE
    # A model-level class of one family (the attention scalar: Gemma only) likewise.
    scale = BUG_CLASSES[11]
    findings, _ = blame.narrow({"test_model.py::test_full_forward_matches_transformers[llama]": [scale, BUG_CLASSES[9]]}, [])
    assert findings[scale].verdict == blame.NOT_IMPLICATED


def test_a_failed_test_of_one_class_clears_a_class_it_explains_everywhere() -> None:
    """A restore that adopts the snapshot's tensors fails the in-place test (guarding both snapshot
    classes) and the sharing test (guarding sharing alone): one sharing bug explains both, one
    rebinding bug not the second, so rebinding is not implicated. Where the rebinding class is also
    guarded by a failed test that does not guard sharing, neither explains everything: both stay."""
    rebinds, shares = "restore rebinds the buffers (a captured graph reads stale memory)", "restored cache shares the snapshot's storage"
    failed = {"test_restore_in_place": [rebinds, shares], "test_shares_nothing": [shares]}
    findings, note = blame.narrow(failed, [])
    assert note is None
    assert findings[rebinds].verdict == blame.NOT_IMPLICATED and "test_shares_nothing" in findings[rebinds].why
    assert findings[shares].verdict == blame.IMPLICATED
    findings, _ = blame.narrow({**failed, "test_rebinds_alone": [rebinds]}, [])
    assert findings[rebinds].verdict == blame.IMPLICATED and findings[shares].verdict == blame.IMPLICATED
    # A model-level class is never cleared this way: the probes judge it.
    findings, _ = blame.narrow({"test_chunks": [sig.TOP_LEFT, sig.UNWRITTEN], "test_update": [sig.UNWRITTEN]}, [])
    assert findings[sig.TOP_LEFT].verdict == blame.POSSIBLE
