"""The kit's comparison helpers decide every verdict: each decision on both sides of its boundary.

Direct calls on small tensors. Expected values are arithmetic stated here (dyadic numbers that are
exact in float64, ``math.log`` for log-softmax), never the helpers' own output. A failure message is
the kit's user interface, so the numbers and positions it reports are checked line by line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import settings

from infer_ref.conformance import assertions, tiers
from infer_ref.conformance.assertions import (
    assert_close,
    assert_equal,
    assert_logits_agree,
    assert_tokens_equal,
    assert_visibility,
    fail,
    note,
    repro_command,
)

F64 = torch.float64
PARAMS = {"seed": 7, "chunks": [2, 1]}
PARAM_LINES = ["drawn parameters:", "  seed = 7", "  chunks = [2, 1]"]


def _message(call: Callable[..., None], *args: Any, **kwargs: Any) -> list[str]:
    """The lines of the AssertionError ``call`` raises, its last (the repro command) checked here."""
    with pytest.raises(AssertionError) as err:
        call(*args, **kwargs)
    lines = str(err.value).split("\n")
    assert lines[-1] == f"repro: {repro_command()}"
    return lines[:-1]


@pytest.fixture
def strict() -> Iterator[None]:
    before = tiers.strict_float64()
    tiers.set_strict_float64(True)
    try:
        yield
    finally:
        tiers.set_strict_float64(before)


@pytest.fixture
def notes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The precision notes written during the test (the global list left as it was)."""
    fresh: list[str] = []
    monkeypatch.setattr(tiers, "PRECISION_NOTES", fresh)
    monkeypatch.setattr(tiers, "_STRICT", {"strict": False})
    return fresh


# --- the report layout: fail, note, the drawn parameters, the repro command ---------------------


def test_fail_prints_title_details_parameters_and_repro() -> None:
    lines = _message(fail, "cache length 3 != 4", params=PARAMS, details=("  after update 2",))
    assert lines == ["cache length 3 != 4", "  after update 2", *PARAM_LINES]


def test_fail_without_parameters_says_none() -> None:
    assert _message(fail, "x") == ["x", "drawn parameters:", "  (none)"]
    assert _message(fail, "x", params={}) == ["x", "drawn parameters:", "  (none)"]


def test_note_records_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[str] = []
    monkeypatch.setattr(assertions, "NOTES", recorded)
    note("the error does not name the value")
    assert recorded == ["the error does not name the value"]


def _profile() -> str:
    return f"--hypothesis-profile={settings.get_current_profile_name()}"


def test_repro_command_names_the_test_impl_device_dtype_and_strict(monkeypatch: pytest.MonkeyPatch, strict: None) -> None:
    # A parameter id with " (" in it: only the last " (" starts pytest's phase suffix.
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/t.py::test_x[a (b) (c)] (call)")
    monkeypatch.setattr(assertions, "_CONTEXT", {"impl": "pkg.mod:ADAPTER", "device": "cuda", "dtype": "bfloat16"})
    assert repro_command() == (
        "pytest 'tests/t.py::test_x[a (b) (c)]' -p no:xdist --ir-impl=pkg.mod:ADAPTER "
        f"--ir-device=cuda --ir-dtype=bfloat16 --ir-strict-float64 {_profile()}"
    )


def test_repro_command_of_a_kit_test_works_outside_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Run from a wheel install, the node id holds the venv's path: the command names the module by package.
    monkeypatch.setattr(tiers, "_STRICT", {"strict": False})
    monkeypatch.setattr(assertions, "_CONTEXT", {"impl": "pkg.mod:ADAPTER"})
    for where in ("infer_ref/conformance/tests", "../venv/lib/python3.11/site-packages/infer_ref/conformance/tests"):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{where}/test_masks.py::test_boundary_cases[1-0-None] (call)")
        assert repro_command() == (
            "pytest --pyargs infer_ref.conformance.tests.test_masks -p no:xdist -k 'test_boundary_cases[1-0-None]' "
            f"--ir-impl=pkg.mod:ADAPTER {_profile()}"
        )


def test_repro_command_leaves_out_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiers, "_STRICT", {"strict": False})
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/t.py::test_y (setup)")
    monkeypatch.setattr(assertions, "_CONTEXT", {"device": "cpu", "dtype": "float64"})
    assert repro_command() == f"pytest tests/t.py::test_y -p no:xdist {_profile()}"
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # called outside a running test
    monkeypatch.setattr(assertions, "_CONTEXT", {})
    assert repro_command() == f"pytest --pyargs infer_ref.conformance.tests -p no:xdist -k '<test id>' {_profile()}"


def test_set_run_context_is_what_repro_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assertions, "_CONTEXT", {})
    assertions.set_run_context(impl="a:B", device="cpu")
    assert assertions._CONTEXT == {"impl": "a:B", "device": "cpu"}


# --- assert_close: the tolerance, shapes, NaN, and what a failure reports ------------------------


def test_assert_close_reports_count_max_error_first_position_and_neighbours() -> None:
    actual = torch.tensor([[0.0, 0.0, 0.0], [0.25, 0.0, 1.0]], dtype=F64)
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.5]], dtype=F64)
    # (1, 0) is 0.25 off and (1, 2) 0.5 off, both beyond atol 0.1: the first is (1, 0), the largest (1, 2).
    lines = _message(assert_close, actual, expected, what="logits of chunk 2", atol=0.1, rtol=0.0, params=PARAMS)
    assert lines == [
        "logits of chunk 2: 2 of 6 elements differ beyond atol=0.1, rtol=0",
        "  shape (2, 3), dtypes actual torch.float64 / expected torch.float64",
        "  max abs error 5.000e-01 at (1, 2)",
        "  first differing position (1, 0): actual 0.25, expected 0",
        "  actual   [0:3] = [0.25, 0, 1]",
        "  expected [0:3] = [0, 0, 0.5]",
        *PARAM_LINES,
    ]


def test_assert_close_tolerance_is_met_exactly_at_atol_plus_rtol_times_expected() -> None:
    expected = torch.tensor([2.0], dtype=F64)
    # atol 0.25 + rtol 0.125 * |2| = 0.5: a difference of exactly 0.5 (all dyadic) is within it.
    assert_close(torch.tensor([2.5], dtype=F64), expected, what="x", atol=0.25, rtol=0.125)
    assert_close(torch.tensor([1.5], dtype=F64), expected, what="x", atol=0.25, rtol=0.125)
    with pytest.raises(AssertionError, match="1 of 1 elements differ beyond atol=0.25, rtol=0.125"):
        assert_close(torch.tensor([2.5 + 2**-20], dtype=F64), expected, what="x", atol=0.25, rtol=0.125)


def test_assert_close_default_tolerance_is_1e_9() -> None:
    zero = torch.zeros(1, dtype=F64)
    assert_close(torch.tensor([1e-9], dtype=F64), zero, what="x")
    with pytest.raises(AssertionError, match="beyond atol=1e-09, rtol=1e-09"):
        assert_close(torch.tensor([2e-9], dtype=F64), zero, what="x")
    # rtol 1e-9 of |expected| = 1e6 is 1e-3: 2**-11 (4.9e-4) is within, 2**-9 (2e-3) is not.
    big = torch.tensor([1e6], dtype=F64)
    assert_close(big + 2**-11, big, what="x")
    with pytest.raises(AssertionError):
        assert_close(big + 2**-9, big, what="x")


def test_assert_close_compares_in_float64_whatever_the_dtypes() -> None:
    # float32: 3 has an ulp of 2**-22. rtol * 3 just under 2**-22 in float64 (the difference
    # fails) rounds up to 2**-22 in float32 (it would pass): the tolerance must be float64 arithmetic.
    three = torch.tensor([3.0], dtype=torch.float32)
    rtol = 2**-22 / 3 * (1 - 2**-40)
    with pytest.raises(AssertionError, match="1 of 1 elements differ"):
        assert_close(three + 2**-22, three, what="x", atol=0.0, rtol=rtol)
    with pytest.raises(AssertionError, match="dtypes actual torch.float32 / expected torch.float32"):
        assert_close(three + 2**-22, three, what="x", atol=0.0, rtol=rtol)


def test_assert_close_reports_nan_as_an_infinite_error_at_its_position() -> None:
    actual = torch.tensor([float("nan"), 0.5], dtype=F64)
    lines = _message(assert_close, actual, torch.zeros(2, dtype=F64), what="x", atol=1.0, rtol=0.0)
    assert lines[:4] == [
        "x: 1 of 2 elements differ beyond atol=1, rtol=0",
        "  shape (2,), dtypes actual torch.float64 / expected torch.float64",
        "  max abs error inf at (0,)",
        "  first differing position (0,): actual nan, expected 0",
    ]


def test_assert_close_inf_against_a_finite_value_fails() -> None:
    with pytest.raises(AssertionError, match=r"at \(1,\)\n  first differing position \(1,\): actual inf, expected 0"):
        assert_close(torch.tensor([0.0, float("inf")], dtype=F64), torch.zeros(2, dtype=F64), what="x", atol=1e300)


def test_assert_close_empty_tensors_agree() -> None:
    assert_close(torch.zeros(0, 3, dtype=F64), torch.zeros(0, 3, dtype=F64), what="x")


def test_assert_close_shape_mismatch_names_both_shapes_and_dtypes() -> None:
    lines = _message(assert_close, torch.zeros(2, 3), torch.zeros(3, dtype=F64), what="k of layer 1", params=PARAMS)
    assert lines == [
        "k of layer 1: shape (2, 3) != expected (3,)",
        "  dtypes: actual torch.float32, expected torch.float64",
        *PARAM_LINES,
    ]


def test_assert_close_refuses_what_is_not_a_tensor() -> None:
    lines = _message(assert_close, [0.0], torch.zeros(1), what="v", params=PARAMS)
    assert lines == ["v: expected a tensor, got list", *PARAM_LINES]


def test_neighbourhood_is_the_row_around_the_first_difference() -> None:
    # 1-D, first difference at 5 of 10: three either side, [2:9].
    actual = torch.arange(10, dtype=F64)
    expected = actual.clone()
    expected[5] = 50.0
    lines = _message(assert_close, actual, expected, what="x")
    assert lines[4:6] == ["  actual   [2:9] = [2, 3, 4, 5, 6, 7, 8]", "  expected [2:9] = [2, 3, 4, 50, 6, 7, 8]"]
    # Near the start the window is cut at 0.
    expected = actual.clone()
    expected[1] = 10.0
    assert _message(assert_close, actual, expected, what="x")[4] == "  actual   [0:5] = [0, 1, 2, 3, 4]"
    # 3-D: the row is the last dimension at the first difference's leading indices.
    actual = torch.arange(12, dtype=F64).reshape(2, 3, 2)
    expected = actual.clone()
    expected[1, 2, 0] = -1.0
    lines = _message(assert_close, actual, expected, what="x")
    assert lines[3:6] == [
        "  first differing position (1, 2, 0): actual 10, expected -1",
        "  actual   [0:2] = [10, 11]",
        "  expected [0:2] = [-1, 11]",
    ]


def test_neighbourhood_of_a_scalar_and_of_a_single_element() -> None:
    lines = _message(assert_close, torch.tensor(1.5, dtype=F64), torch.tensor(0.5, dtype=F64), what="x")
    assert lines[3:6] == ["  first differing position (): actual 1.5, expected 0.5", "  actual   1.5", "  expected 0.5"]
    lines = _message(assert_close, torch.tensor([1.5], dtype=F64), torch.tensor([0.5], dtype=F64), what="x")
    assert lines[4:6] == ["  actual   [0:1] = [1.5]", "  expected [0:1] = [0.5]"]


# --- assert_equal: bitwise ----------------------------------------------------------------------


def test_assert_equal_fails_on_any_difference_and_names_it() -> None:
    # 1e-10 is inside the default 1e-9 tolerance, 2**-20 inside 1e-9 * 1e6: bitwise equality fails both.
    zero = torch.zeros(1, dtype=F64)
    lines = _message(assert_equal, zero + 1e-10, zero, what="stored v", params=PARAMS)
    assert lines[0] == "stored v: 1 of 1 elements differ beyond atol=0, rtol=0"
    assert lines[-3:] == PARAM_LINES
    big = torch.tensor([1e6], dtype=F64)
    with pytest.raises(AssertionError, match="stored k: 1 of 1 elements differ"):
        assert_equal(big + 2**-20, big, what="stored k")
    assert_equal(big.clone(), big, what="stored k")


def test_assert_equal_is_not_within_one() -> None:
    # atol 1 or rtol 1 would let 0.5 off 0 / 1.5 off 1 through.
    with pytest.raises(AssertionError, match="x: 1 of 1"):
        assert_equal(torch.tensor([0.5], dtype=F64), torch.zeros(1, dtype=F64), what="x")
    with pytest.raises(AssertionError, match="x: 1 of 1"):
        assert_equal(torch.tensor([1.5], dtype=F64), torch.ones(1, dtype=F64), what="x")


def test_assert_equal_names_a_dtype_mismatch() -> None:
    lines = _message(assert_equal, torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=F64), what="k", params=PARAMS)
    assert lines == ["k: dtype torch.float32 != expected torch.float64", *PARAM_LINES]


def test_assert_equal_judges_bool_tables() -> None:
    mask = torch.tensor([[True, False], [True, True]])
    assert_equal(mask.clone(), mask, what="mask")
    wrong = mask.clone()
    wrong[0, 1] = True
    lines = _message(assert_equal, wrong, mask, what="mask")
    assert lines[:4] == [
        "mask: 1 of 4 elements differ beyond atol=0, rtol=0",
        "  shape (2, 2), dtypes actual torch.bool / expected torch.bool",
        "  max abs error 1.000e+00 at (0, 1)",
        "  first differing position (0, 1): actual 1, expected 0",
    ]


# --- the float64 tiers: exact, float32 intermediates (a note, or a failure when strict), wrong --


def _with(value: float, exact_shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Zeros with ``value`` at [1, 2]: its distance from zeros is ``value / (1 + 0)`` = ``value``."""
    t = torch.zeros(exact_shape, dtype=F64)
    t[1, 2] = value
    return t


def test_float64_distance_at_the_exact_bound_passes_without_a_note(notes: list[str]) -> None:
    assert_logits_agree(_with(1e-9), _with(0.0), dtype=F64, what="logits")
    assert_logits_agree(_with(0.25), _with(0.0), dtype=F64, what="logits", exact=0.25)
    assert notes == []


def test_float64_caller_exact_bound_is_the_one_used(notes: list[str]) -> None:
    # 2**-21 (4.8e-7) is within exact=1e-6: no note, though beyond the default 1e-9.
    assert_logits_agree(_with(2.0**-21), _with(0.0), dtype=F64, what="logits", exact=1e-6)
    assert notes == []


def test_float64_middle_tier_passes_with_a_precision_note(notes: list[str]) -> None:
    # 2**-20 = 9.54e-7: beyond 1e-9, within 1e-4. Default exact bound.
    assert_logits_agree(_with(2.0**-20), _with(0.0), dtype=F64, what="logits at step 3")
    assert notes == [
        "logits at step 3: float64 with float32 intermediates (9.5e-07 from the float64 oracle: beyond the "
        "exact tier's 1e-09, within the 0.0001 that float32 norms, RoPE angles or softmax explain)"
    ]
    notes.clear()
    assert_logits_agree(_with(2e-9), _with(0.0), dtype=F64, what="l")  # just beyond the default 1e-9
    assert len(notes) == 1 and notes[0].startswith("l: float64 with float32 intermediates (2.0e-09 ")


def test_float64_middle_tier_fails_under_strict_float64(notes: list[str], strict: None) -> None:
    tiers.set_strict_float64(True)
    lines = _message(assert_logits_agree, _with(2.0**-20), _with(0.0), dtype=F64, what="logits", params=PARAMS, exact=2e-7)
    # assert_close at atol = rtol = exact: |d| <= 2e-7 * (1 + 0) fails at [1, 2] only.
    assert lines[0] == (
        "logits [float64 with float32 intermediates, failed because --strict-float64 was given]: "
        "1 of 6 elements differ beyond atol=2e-07, rtol=2e-07"
    )
    assert lines[2:4] == ["  max abs error 9.537e-07 at (1, 2)", "  first differing position (1, 2): actual 9.5367431640625e-07, expected 0"]
    assert lines[-3:] == PARAM_LINES
    assert notes == []


def test_float64_wrong_tier_fails_and_says_why(notes: list[str]) -> None:
    lines = _message(assert_logits_agree, _with(1e-3), _with(0.0), dtype=F64, what="logits", params=PARAMS, exact=1e-6)
    assert lines[0] == "logits [wrong: beyond the 0.0001 that float32 intermediates explain]: 1 of 6 elements differ beyond atol=1e-06, rtol=1e-06"
    assert lines[3] == "  first differing position (1, 2): actual 0.001, expected 0"
    assert lines[-3:] == PARAM_LINES
    assert notes == []


def test_float64_wrong_tier_fails_under_strict_float64_too(strict: None) -> None:
    with pytest.raises(AssertionError, match=r"logits \[wrong: beyond the 0.0001"):
        assert_logits_agree(_with(1.0), _with(0.0), dtype=F64, what="logits")


def test_float64_shapes_that_differ_fail_even_where_they_broadcast(notes: list[str]) -> None:
    lines = _message(assert_logits_agree, torch.zeros(2, 3, dtype=F64), torch.zeros(3, dtype=F64), dtype=F64, what="logits", params=PARAMS)
    assert lines == [
        "logits: shape (2, 3) != expected (3,)",
        "  dtypes: actual torch.float64, expected torch.float64",
        *PARAM_LINES,
    ]
    lines = _message(assert_logits_agree, [0.0], torch.zeros(1, dtype=F64), dtype=F64, what="logits", params=PARAMS)
    assert lines == ["logits: expected a tensor, got list", *PARAM_LINES]


def test_float64_empty_logits_agree(notes: list[str]) -> None:
    assert_logits_agree(torch.zeros(0, 8, dtype=F64), torch.zeros(0, 8, dtype=F64), dtype=F64, what="x")
    assert notes == []


# --- lower precision: the golden files' teacher-forced rule (bfloat16: eps 0.5, top-k atol 1.5) --

BF16 = torch.bfloat16


def _logits(rows: dict[tuple[int, int], list[float]], vocab: int = 8) -> torch.Tensor:
    """[2, 3, vocab] float64 logits: zeros with token 0 at 4 (the top), and the rows given."""
    t = torch.zeros(2, 3, vocab, dtype=F64)
    t[..., 0] = 4.0
    for (b, s), row in rows.items():
        t[b, s, : len(row)] = torch.tensor(row, dtype=F64)
    return t


def _log_softmax(row: list[float]) -> list[float]:
    norm = math.log(sum(math.exp(x) for x in row))
    return [x - norm for x in row]


def test_low_precision_identical_and_shifted_logits_agree() -> None:
    theirs = _logits({(0, 1): [1.0, 3.0, 2.0, -1.0, 0.5, 0.25, 2.5, 1.5]})
    assert_logits_agree(theirs.clone(), theirs, dtype=BF16, what="x")
    # Logprobs do not move when a position's logits shift by a constant (a different one per position).
    shift = torch.arange(6, dtype=F64).reshape(2, 3, 1) * 3.0
    assert_logits_agree(theirs + shift, theirs, dtype=BF16, what="x")
    assert_logits_agree(theirs.to(torch.float32), theirs, dtype=BF16, what="x")  # any dtype in
    assert_logits_agree(torch.zeros(0, 8), torch.zeros(0, 8), dtype=BF16, what="x")  # nothing to compare


def test_low_precision_deficit_exactly_eps_passes_just_over_fails() -> None:
    # The top two swapped, 0.5 apart: the normalizer is the same (a permutation), so our logprob of
    # the expected top token is exactly 0.5 below our best (and the top-k logprobs 0.5 off: < 1.5).
    assert_logits_agree(_logits({(1, 1): [0.0, 0.5, 0, 0]}, 4), _logits({(1, 1): [0.5, 0.0, 0, 0]}, 4), dtype=BF16, what="x")
    over = 0.5 + 2**-6
    with pytest.raises(AssertionError, match=r"x: 1 of 6 positions outside the torch.bfloat16 tolerance \(eps 0.5, top-k atol 1.5\)"):
        assert_logits_agree(_logits({(1, 1): [0.0, over, 0, 0]}, 4), _logits({(1, 1): [over, 0.0, 0, 0]}, 4), dtype=BF16, what="x")


def test_low_precision_topk_gap_exactly_atol_passes_just_over_fails() -> None:
    # Two tokens below the top swapped, 1.5 apart: the normalizer is the same (a permutation), so
    # their logprobs differ by exactly 1.5 (exact in float64 for these dyadic logits), the top is kept.
    theirs, ours = _logits({(0, 2): [4.0, -3.0, -1.5]}, 3), _logits({(0, 2): [4.0, -1.5, -3.0]}, 3)
    assert_logits_agree(ours, theirs, dtype=BF16, what="x")
    theirs, ours = _logits({(0, 2): [4.0, -3.0625, -1.5]}, 3), _logits({(0, 2): [4.0, -1.5, -3.0625]}, 3)
    with pytest.raises(AssertionError, match=r"first position \(0, 2\): expected top token 0 is 0 below our best \(our top token 0\); worst top-3 \|Δlogprob\| 1.562"):
        assert_logits_agree(ours, theirs, dtype=BF16, what="x")


def test_low_precision_failure_reports_first_position_tokens_and_worst_values() -> None:
    # Two positions fail: (0, 2) (first) and (1, 1). At (0, 2) our token 3 is at 5 against the
    # expected top token 0 at 4: a deficit of exactly 1. At (1, 1) token 0 is at 7: a deficit of 0 but
    # its logprob moves.
    theirs = _logits({})
    ours = _logits({(0, 2): [4.0, 0.0, 0.0, 5.0], (1, 1): [7.0]})
    ours_02 = _log_softmax([4.0, 0, 0, 5.0, 0, 0, 0, 0])
    ours_11 = _log_softmax([7.0, 0, 0, 0, 0, 0, 0, 0])
    base = _log_softmax([4.0, 0, 0, 0, 0, 0, 0, 0])
    # Theirs' top-5 are token 0 and four of the tied zeros: the same value at each of tokens 1..7.
    delta_02 = max(abs(ours_02[0] - base[0]), abs(ours_02[1] - base[1]))
    delta_11 = max(abs(ours_11[0] - base[0]), abs(ours_11[1] - base[1]))
    lines = _message(assert_logits_agree, ours, theirs, dtype=BF16, what="golden step", params=PARAMS)
    assert lines == [
        "golden step: 2 of 6 positions outside the torch.bfloat16 tolerance (eps 0.5, top-k atol 1.5)",
        f"  first position (0, 2): expected top token 0 is 1 below our best (our top token 3); worst top-5 |Δlogprob| {delta_02:.4g}",
        f"  max deficit 1, max top-k |Δlogprob| {max(delta_02, delta_11):.4g}",
        *PARAM_LINES,
    ]


def test_low_precision_top_k_is_capped_by_the_vocabulary_and_chosen_by_the_caller() -> None:
    theirs = _logits({}, vocab=4)
    ours = _logits({(0, 0): [4.0, 0, 0, 9.0]}, vocab=4)
    with pytest.raises(AssertionError, match="worst top-4 "):
        assert_logits_agree(ours, theirs, dtype=BF16, what="x")
    with pytest.raises(AssertionError, match="worst top-2 "):
        assert_logits_agree(ours, theirs, dtype=BF16, what="x", top_k=2)


def test_low_precision_nan_fails_its_position_only() -> None:
    ours = _logits({})
    ours[1, 0, 5] = float("nan")
    with pytest.raises(AssertionError, match=r"x: 1 of 6 positions outside .*\n  first position \(1, 0\)"):
        assert_logits_agree(ours, _logits({}), dtype=BF16, what="x")


def test_low_precision_tolerance_is_the_dtypes() -> None:
    # float16: eps 0.25 — the bfloat16 deficit of exactly 0.5 fails there; float32: eps 1e-4.
    ours, theirs = _logits({(1, 1): [0.0, 0.5, 0, 0]}, 4), _logits({(1, 1): [0.5, 0.0, 0, 0]}, 4)
    with pytest.raises(AssertionError, match=r"torch.float16 tolerance \(eps 0.25, top-k atol 0.5\)"):
        assert_logits_agree(ours, theirs, dtype=torch.float16, what="x")
    with pytest.raises(AssertionError, match=r"torch.float32 tolerance \(eps 0.0001, top-k atol 0.001\)"):
        assert_logits_agree(ours, theirs, dtype=torch.float32, what="x")


def test_low_precision_shapes_that_differ_fail() -> None:
    lines = _message(assert_logits_agree, torch.zeros(2, 8), torch.zeros(3, 8), dtype=BF16, what="logits", params=PARAMS)
    assert lines == ["logits: shape (2, 8) != expected (3, 8)", *PARAM_LINES]


# --- assert_visibility ------------------------------------------------------------------------


def test_visibility_names_the_first_pair_both_key_lists_and_the_count() -> None:
    want = torch.tensor([[True, True, False, False], [True, True, True, False]])
    got = torch.tensor([[True, True, False, False], [False, True, True, True]])
    lines = _message(assert_visibility, got, want, q_len=2, start=2, window=3, params=PARAMS)
    assert lines == [
        "attention mask: query 1 (position 3) misses key 0; q_len=2, start=2, window=3",
        "  query 1 sees keys    [1, 2, 3]",
        "  it should see keys     [0, 1, 2]",
        "  2 (query, key) pairs differ in total",
        *PARAM_LINES,
    ]
    got = want.clone()
    got[0, 3] = True
    assert _message(assert_visibility, got, want, q_len=2, start=2, window=None)[0] == (
        "attention mask: query 0 (position 2) sees key 3; q_len=2, start=2, window=None"
    )
    assert_visibility(want.clone(), want, q_len=2, start=2, window=3)


def test_visibility_shape_mismatch_names_both_shapes_and_the_step() -> None:
    lines = _message(assert_visibility, torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 4, dtype=torch.bool), q_len=2, start=2, window=None, params=PARAMS)
    assert lines == ["attention mask shape (2, 3) != expected (2, 4) (q_len=2, start=2, window=None)", *PARAM_LINES]


# --- assert_tokens_equal ----------------------------------------------------------------------


def test_tokens_first_difference_is_reported_with_both_sequences() -> None:
    lines = _message(assert_tokens_equal, (5, 6, 7, 9), [5, 6, 8, 9], what="greedy", params=PARAMS)
    assert lines == [
        "greedy: tokens differ at step 2",
        "  actual   (4 tokens) [5, 6, 7, 9]",
        "  expected (4 tokens) [5, 6, 8, 9]",
        "  at step 2: actual 7, expected 8",
        *PARAM_LINES,
    ]
    assert_tokens_equal((5, 6), [5, 6], what="greedy")


def test_tokens_a_shorter_sequence_ends_where_the_other_goes_on() -> None:
    lines = _message(assert_tokens_equal, [1, 2], [1, 2, 3], what="stop")
    assert lines[0] == "stop: tokens differ at step 2"
    assert lines[3] == "  at step 2: actual <end>, expected 3"
    lines = _message(assert_tokens_equal, [1, 2, 3, 4], [1, 2], what="stop")
    assert lines[3] == "  at step 2: actual 3, expected <end>"
    assert _message(assert_tokens_equal, [], [0], what="s")[3] == "  at step 0: actual <end>, expected 0"


def test_low_precision_rule_is_computed_in_float64_whatever_the_inputs_dtype() -> None:
    # The same bfloat16-exact logits on both sides agree exactly in float64. Their log-softmax held
    # in bfloat16 would round ln 2 (0.693147) to 0.691406: 1.7e-3 off, beyond float32's top-k 1e-3.
    row = [0.0, 0.0, -20.5]
    logits = _logits({(b, s): row for b in range(2) for s in range(3)}, 3)
    for ours, theirs in ((logits.to(BF16), logits), (logits, logits.to(BF16))):
        assert_logits_agree(ours, theirs, dtype=torch.float32, what="x")
