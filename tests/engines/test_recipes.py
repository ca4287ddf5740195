"""The low-precision recipes: each legitimate variant and each bug changes *where* the model rounds,
never the mathematics (in float64 they are the canonical model), and each does round where it says
(stated arithmetic: a bfloat16 running sum stalls at 256; stochastic rounding is unbiased between
the two neighbours; the bfloat16 normaliser of hidden 304 is 17.375; truncation keeps the neighbour
nearer 0; a bfloat16 running mean square loses the squares below half an ulp of its sum)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.engines.recipes import (
    BUGS,
    LEGITIMATE,
    Recipe,
    eager_attention,
    patched,
    rms_variance_sequential_low,
    softmax_accumulated_low,
    stochastic_round,
    truncate_toward_zero,
)
from infer_ref.conformance.engines.workloads.checkpoints import write_all
from infer_ref.conformance.engines.workloads.numerics_checkpoints import (
    GEMMA3_HIDDEN304,
    LLAMA3_RMS_ANCHOR,
    NUMERICS_STYLE,
)
from infer_ref.conformance.profiles import one_thread
from infer_ref.loader import load_model
from infer_ref.models.common import RMSNorm

RECIPES = {r.name: r for r in (*LEGITIMATE, *BUGS)}
# Recipes that compute in the model's dtype or wider, so that in float64 nothing is rounded (the others
# name float32 on purpose: logits, residual, stochastic rounding, and the kit's 1 + w knob).
SAME_MATH_IN_FLOAT64 = ("eager_attention", "rms_norm_low_precision", "rope_inv_freq_low_precision",
                        "softmax_sum_low_precision", "fused_add_norm_float32", "fused_add_rounded_once",
                        "fused_add_norm_truncated", "rms_variance_sequential_low_precision")  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    specs = (LLAMA3_RMS_ANCHOR, GEMMA3_HIDDEN304)
    with one_thread():  # the module on one thread
        written = write_all(tmp_path_factory.mktemp("numerics"), specs=specs, styles=(NUMERICS_STYLE,))
        yield {spec.architecture["model_type"]: folder for spec, folder in zip(specs, written, strict=True)}


def _logits(folder: Path, dtype: torch.dtype, recipe: Recipe | None) -> torch.Tensor:
    model, config = load_model(folder, dtype=dtype, device="cpu")
    if recipe is not None:
        patched(model, recipe)
    ids = torch.randint(0, config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(ids)[0].double()


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("name", SAME_MATH_IN_FLOAT64)
def test_a_recipe_is_the_canonical_model_in_float64(folders: dict[str, Path], family: str, name: str) -> None:
    recipe = RECIPES[name]
    if recipe.families and family not in recipe.families:
        pytest.skip(f"{name} is for {recipe.families}")
    reference = _logits(folders[family], torch.float64, None)
    assert torch.allclose(_logits(folders[family], torch.float64, recipe), reference, atol=1e-9, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("recipe", [*LEGITIMATE[1:], *BUGS], ids=lambda r: r.name)
def test_every_recipe_rounds_differently_from_the_canonical_one_where_it_applies(
    folders: dict[str, Path], family: str, recipe: Recipe
) -> None:
    # In its dtype, on a checkpoint where its quantity is inexact, each recipe changes the logits:
    # a patch that silently did nothing would make the power table measure the control twice.
    dtypes = [d for d in ("bfloat16", "float16") if recipe.applies_to(family, d)]
    if not dtypes:
        pytest.skip(f"{recipe.name} does not apply to {family}")
    if recipe.name == "embed_normaliser_float32" or recipe.name == "embed_normaliser_bf16":
        assert family == "gemma3_text"  # hidden 304: sqrt inexact in both dtypes
    dtype = getattr(torch, dtypes[0])
    assert not torch.equal(_logits(folders[family], dtype, recipe), _logits(folders[family], dtype, None))


def test_the_bf16_normaliser_bug_is_the_canonical_recipe_in_bfloat16(folders: dict[str, Path]) -> None:
    # sqrt(304) rounded to bf16 is 17.375 either way: in bfloat16 the "bug" changes nothing (not exercised).
    assert float(torch.tensor(math.sqrt(304), dtype=torch.bfloat16)) == 17.375
    bug = RECIPES["embed_normaliser_bf16"]
    assert bug.dtypes == ("float16",)
    folder = folders["gemma3_text"]
    assert torch.equal(_logits(folder, torch.bfloat16, bug), _logits(folder, torch.bfloat16, None))


def test_a_bfloat16_running_sum_stalls_at_256() -> None:
    # 300 equal scores: every exponential is 1; in bf16 256 + 1 = 257 is a tie between 256 and 258
    # that rounds to even, 256, so the sum stalls there and each probability is 1/256, not 1/300.
    q = torch.zeros(1, 1, 1, 4, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, 300, 4, dtype=torch.bfloat16)
    v = torch.ones(1, 1, 300, 4, dtype=torch.bfloat16)
    out = softmax_accumulated_low(q, k, v, None, 1.0)
    assert torch.allclose(out.float(), torch.full((1, 1, 1, 4), 300 / 256), rtol=2**-8)
    # Eager's float32 softmax gives 1/300, rounded to bf16 (2^-9 relative) and the product again: 1 within 2^-8.
    assert torch.allclose(eager_attention(q, k, v, None, 1.0).float(), torch.ones(1, 1, 1, 4), rtol=2**-8)


def test_stochastic_rounding_is_unbiased_between_the_two_neighbours() -> None:
    # 1 + 2^-9 lies a quarter of the way from 1 to 1 + 2^-7 (bf16 neighbours): up with probability 1/4.
    y = torch.full((20000,), 1 + 2.0**-9)
    out = stochastic_round(y, torch.bfloat16, torch.Generator().manual_seed(0)).float()
    assert set(out.unique().tolist()) == {1.0, 1 + 2.0**-7}
    share_up = float((out > 1).float().mean())
    assert abs(share_up - 0.25) < 4 * math.sqrt(0.25 * 0.75 / y.numel())
    exact = torch.tensor([1.0, -3.5, 0.0])  # representable values stay put
    assert torch.equal(stochastic_round(exact, torch.float16, torch.Generator()).float(), exact)


def test_truncation_keeps_the_neighbour_nearer_zero() -> None:
    # 1 + 3 * 2^-9 lies three quarters of the way from 1 to 1 + 2^-7 (bf16 neighbours): to nearest it
    # is 1 + 2^-7, truncated 1; the negative likewise -1; representable values stay put.
    y = torch.tensor([1 + 3 * 2.0**-9, -(1 + 3 * 2.0**-9), 1 + 2.0**-7, -2.0, 0.0])
    assert y[:1].to(torch.bfloat16).float().tolist() == [1 + 2.0**-7]
    assert truncate_toward_zero(y, torch.bfloat16).float().tolist() == [1.0, -1.0, 1 + 2.0**-7, -2.0, 0.0]
    half = torch.tensor([1 + 3 * 2.0**-12])  # float16: ulp 2^-10, three quarters of it up
    assert truncate_toward_zero(half, torch.float16).float().tolist() == [1.0]


def test_a_sequential_bfloat16_mean_square_loses_the_small_squares() -> None:
    # One channel of 256 then 63 of 1: the running sum of squares starts at 65536, whose bfloat16 ulp is
    # 512, so each 1 rounds away: mean square 65536 / 64 = 1024, not 65599 / 64; the norm's output in
    # a unit channel is then 1 / 32 (weights 1), where torch's mean (float32) gives 1 / 32.0155.
    norm = RMSNorm(64, eps=0.0)
    x = torch.ones(1, 64, dtype=torch.bfloat16)
    x[0, 0] = 256.0
    model = torch.nn.Sequential(norm.to(torch.bfloat16))
    rms_variance_sequential_low(model)
    out = norm(x).float()
    assert out[0, 1].item() == 1 / 32
    assert (
        abs(RMSNorm(64, eps=0.0).to(torch.bfloat16)(x).float()[0, 1].item() - 1 / math.sqrt(65599 / 64))
        < 2**-14
    )


def test_the_bug_softmax_takes_a_mask_per_row() -> None:
    # A [B, T, S] mask (a batch of rows of different lengths) masks each row's own keys: in float64 the
    # running sum is exact, so the bug equals eager attention.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 3, 3, dtype=torch.bool).tril()
    mask[1, :, 0] = False  # row 1 never sees key 0
    mask[1, 0, :] = False  # nor its query 0 any key: output 0, not NaN
    out = softmax_accumulated_low(q, k, v, mask, 0.5)
    assert torch.equal(out[1, :, 0], torch.zeros(2, 4, dtype=torch.float64))
    assert torch.allclose(out[:, :, 1:], eager_attention(q, k, v, mask, 0.5)[:, :, 1:], atol=1e-12, rtol=0)
