"""``rms_norm_one_flip``: the values RMSNorm's definition could give with its one low-precision
rounding flipped, which is what another fp32 summation order of the mean square gives (the kit's
low-precision norm tests allow a rare element to be one of them). Stated arithmetic: the mean square
summed in another order is the definition's fp32 value moved by at most an ulp or two."""

from __future__ import annotations

import pytest
import torch

from infer_ref.conformance.oracles.definitions import (
    rms_norm_definition,
    rms_norm_one_flip,
    rms_norm_scaled,
    ulps_apart,
)

EPS = 1e-6


def _reordered_sum_norm(x: torch.Tensor, weight: torch.Tensor, gemma: bool) -> torch.Tensor:
    """The definition with the mean square summed back to front (another legitimate fp32 order)."""
    x32 = x.float()
    squares = x32.pow(2)
    total = torch.zeros(squares.shape[:-1], dtype=torch.float32)
    for i in reversed(range(squares.shape[-1])):
        total = total + squares[..., i]
    r = x32 * torch.rsqrt((total / squares.shape[-1])[..., None] + EPS)
    return rms_norm_scaled(r, weight, x.dtype, gemma)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
def test_another_summation_order_gives_the_definition_or_one_flip(dtype: torch.dtype, gemma: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    rows = 4096 if dtype == torch.float16 else 65536  # bf16 rounds 8x coarser: flips are rarer
    x = (torch.randn(rows, 64, generator=generator) * 8).to(dtype)
    weight = ((torch.rand(64, generator=generator) * 2 + 1.2) * torch.sign(torch.randn(64, generator=generator))).to(dtype)
    expected = rms_norm_definition(x, weight, EPS, gemma)
    reordered = _reordered_sum_norm(x, weight, gemma)
    below, above = rms_norm_one_flip(x, weight, EPS, gemma)
    off = reordered != expected
    assert off.any()  # the orders do part somewhere, or this test would show nothing
    assert bool(((reordered == below) | (reordered == above))[off].all())
    # A flip is one ulp of the rounded value: for Gemma (one rounding) one ulp of the result; for
    # Llama/Qwen one ulp of dtype(r) times w, which is at most 2 ulps of w * r before the product's
    # rounding (w * r's spacing is at least |w| / 2 times r's) and at most 3 after it.
    assert int(ulps_apart(reordered, expected).max()) <= (1 if gemma else 3)
    assert int(ulps_apart(below, expected).max()) <= (1 if gemma else 3)
    assert int(ulps_apart(above, expected).max()) <= (1 if gemma else 3)


def test_a_two_ulp_flip_of_the_product_exists_for_llama_in_float16() -> None:
    """The case seen on CUDA: a 1-ulp flip of dtype(r) times w is 2 ulps of the product, so a rule of
    "at most 1 ulp" fails a correct kernel. Stated: r = 0.1788 (fp16 ulp 2^-13 in [0.125, 0.25)),
    w = 2.1836 (fp16), product 0.3904 in [0.25, 0.5) (ulp 2^-12): 2^-13 x 2.1836 = 1.09 ulps of the
    product before its rounding, 2 ulps after it for some r."""
    r = torch.arange(0.125, 0.25, 2**-13, dtype=torch.float32).to(torch.float16)
    weight = torch.tensor(2.1836, dtype=torch.float16)
    up = torch.nextafter(r, torch.full_like(r, 1.0))
    assert int(ulps_apart(weight * up, weight * r).max()) == 2
