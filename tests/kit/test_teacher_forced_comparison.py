"""The teacher-forced comparison of two runs, against log-softmax written out in float64 math.

Logits are small integers, exact in bfloat16 and float32, and no row has a tie, so the oracle's
top-k and argmax are unambiguous; the comparison computes in float32 (1e-6 allowed), where one in
bfloat16 would be off by about 1e-2."""

from __future__ import annotations

import math

import pytest
import torch

from infer_ref.conformance.oracles.golden import Tolerance
from infer_ref.conformance.oracles.teacher_forced import TeacherForcedReport, compare_teacher_forced

REFERENCE = ((2.0, 1.0, 0.0), (0.0, 1.0, -1.0))  # [n=2, V=3]
OTHER = ((2.0, -1.0, 1.0), (1.0, 0.0, -2.0))
FORCED = [0, 1]  # step 0: both runs' argmax; step 1: the reference's only
TOL = Tolerance(eps=1.0, topk_atol=2.0)


def _log_softmax(row: tuple[float, ...]) -> list[float]:
    log_sum = math.log(sum(math.exp(x) for x in row))
    return [x - log_sum for x in row]


def _oracle(top_k: int) -> tuple[float, float, int]:
    """(max deficit, max |Δ logprob| over the reference's top k, steps where both argmaxes are forced)."""
    deficits, diffs, exact = [], [], 0
    for ref_row, oth_row, forced in zip(REFERENCE, OTHER, FORCED, strict=True):
        ref, oth = _log_softmax(ref_row), _log_softmax(oth_row)
        deficits.append(max(oth) - oth[forced])
        top = sorted(range(len(ref)), key=lambda t: -ref[t])[:top_k]
        diffs += [abs(ref[t] - oth[t]) for t in top]
        exact += ref.index(max(ref)) == forced and oth.index(max(oth)) == forced
    return max(deficits), max(diffs), exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k", [1, 2, 10])
def test_deficit_topk_difference_and_exact_steps_match_the_oracle(dtype: torch.dtype, top_k: int) -> None:
    report = compare_teacher_forced(torch.tensor(REFERENCE, dtype=dtype), FORCED, torch.tensor(OTHER, dtype=dtype), TOL, top_k)
    deficit, diff, exact = _oracle(top_k)
    assert report.steps == 2 and report.exact_steps == exact == 1
    assert report.max_deficit == pytest.approx(deficit, abs=1e-6)
    assert report.max_abs_dlogprob == pytest.approx(diff, abs=1e-6)
    assert report.tolerance == TOL


def test_the_default_top_k_covers_five_tokens() -> None:
    reference = torch.arange(7, dtype=torch.float32).flip(-1)[None, :]  # [1, 7]: token i has logit 6 - i
    other = reference.clone()
    other[0, 4] -= 1.0  # the reference's 5th token: inside the default top 5
    other[0, 5] -= 3.0  # its 6th: outside
    ref_lp, oth_lp = torch.log_softmax(reference.double(), -1), torch.log_softmax(other.double(), -1)  # [1, 7]
    expected = float((ref_lp - oth_lp)[0, :5].abs().max())  # tokens 0..4, the reference's top 5
    assert float((ref_lp - oth_lp)[0, :4].abs().max()) < expected - 0.5 < float((ref_lp - oth_lp)[0, 5].abs()) - 1.0
    assert compare_teacher_forced(reference, [0], other, TOL).max_abs_dlogprob == pytest.approx(expected, abs=1e-6)


def test_ok_holds_up_to_both_bounds_inclusive() -> None:
    def report(deficit: float, diff: float) -> TeacherForcedReport:
        return TeacherForcedReport(steps=1, max_deficit=deficit, max_abs_dlogprob=diff, exact_steps=0, tolerance=TOL)

    assert report(1.0, 2.0).ok
    assert not report(1.5, 2.0).ok
    assert not report(1.0, 2.5).ok
    assert "FAILED" in report(1.5, 0.0).summary() and report(1.0, 2.0).summary().endswith(": ok")


def test_the_summary_reports_the_figures() -> None:
    text = TeacherForcedReport(steps=4, max_deficit=0.25, max_abs_dlogprob=0.5, exact_steps=3, tolerance=TOL).summary()
    assert text == "4 steps: max deficit 0.25 (eps 1.0), max |Δlogprob| top-k 0.5 (tol 2.0), argmax equal at 3/4 steps: ok"
    failed = TeacherForcedReport(steps=4, max_deficit=1.5, max_abs_dlogprob=0.5, exact_steps=3, tolerance=TOL).summary()
    assert failed == "4 steps: max deficit 1.5 (eps 1.0), max |Δlogprob| top-k 0.5 (tol 2.0), argmax equal at 3/4 steps: FAILED"


def test_exact_steps_count_each_step_where_both_argmaxes_are_the_forced_token() -> None:
    """Two equal runs forcing each step's argmax (token 0, then token 1): every step counts, and
    nothing else differs. A step's argmax is taken over its own row, not over the whole [n, V]."""
    logits = torch.tensor(REFERENCE)  # [2, 3]: argmax 0 then 1
    report = compare_teacher_forced(logits, [0, 1], logits.clone(), TOL)
    assert (report.exact_steps, report.max_deficit, report.max_abs_dlogprob) == (2, 0.0, 0.0)
    assert compare_teacher_forced(logits, [0, 2], logits.clone(), TOL).exact_steps == 1  # step 1 forces a non-argmax


@pytest.mark.parametrize(
    ("reference", "forced", "other"),
    [
        (torch.zeros(2, 3), [0, 1], torch.zeros(2, 4)),
        (torch.zeros(2, 3), [0], torch.zeros(2, 3)),
        (torch.zeros(2), [0, 1], torch.zeros(2)),  # one row's logits without the step axis
        (torch.zeros(2, 1, 3), [0, 1], torch.zeros(2, 1, 3)),  # a batch axis left in
    ],
    ids=["vocabularies-differ", "steps-differ-from-forced", "1-d", "3-d"],
)
def test_mismatched_shapes_are_refused(reference: torch.Tensor, forced: list[int], other: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"need logits of equal shape \[n, V\]"):
        compare_teacher_forced(reference, forced, other, TOL)
