"""The float64 tiers at their edges: the distance ``needed_tolerance`` measures and the verdict it gets.

Each expected value is stated as arithmetic on exactly representable numbers, so the checks
hold to the last bit: a tolerance met exactly is met, the empty comparison needs nothing, and the
distance is measured in float64 whatever the inputs' dtypes and shapes.
"""

from __future__ import annotations

import torch

from infer_ref.conformance import tiers


def test_a_distance_equal_to_a_tier_bound_is_inside_that_tier() -> None:
    assert tiers.float64_verdict(tiers.EXACT_FLOAT64) == tiers.EXACT
    assert tiers.float64_verdict(tiers.FLOAT32_INTERMEDIATES) == tiers.FLOAT32_STEPS
    assert tiers.float64_verdict(tiers.FLOAT32_INTERMEDIATES * 1.0001) == tiers.WRONG
    assert tiers.float64_verdict(0.25, exact=0.25) == tiers.EXACT  # the caller's own exact bound


def test_the_empty_comparison_needs_no_tolerance() -> None:
    empty = torch.zeros(0, dtype=torch.float64)
    assert tiers.needed_tolerance(empty, empty) == 0.0


def test_the_distance_is_measured_in_float64_whatever_the_inputs_dtype() -> None:
    # 1 + 2**-30 rounds to 1 in float32: measured in float32 the two would agree. In float64 the
    # difference is 2**-30 and 1 + |expected| is 2 (to 1e-9), so the distance is 2**-31 to 1e-9.
    float64_scalar = torch.tensor(1.0 + 2.0**-30, dtype=torch.float64)  # 0-dim: promotes nothing
    float32_row = torch.tensor([1.0], dtype=torch.float32)
    for actual, expected in ((float32_row, float64_scalar), (float64_scalar, float32_row)):
        distance = tiers.needed_tolerance(actual, expected)
        assert abs(distance - 2.0**-31) <= 2.0**-31 * 1e-9, (actual.dtype, expected.dtype, distance)


def test_strict_float64_is_what_was_set() -> None:
    before = tiers.strict_float64()
    try:
        tiers.set_strict_float64(True)
        assert tiers.strict_float64() is True
        tiers.set_strict_float64(False)
        assert tiers.strict_float64() is False
    finally:
        tiers.set_strict_float64(before)
