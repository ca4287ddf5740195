"""The numerics checkpoints do what their design says, by stated arithmetic: every weight exact in
the dtypes each is for; every Gemma norm's 1 + w rounds down by nearly one half-ulp; every Llama
norm's mean square sits just below a bfloat16 midpoint at every position, with rsqrt far from a
power of two; a low-precision RoPE frequency is a phase error of a sixth of a radian at a distance of 1000, and the
far context moves the logprobs; sqrt(hidden) is inexact in both low dtypes; every query of the sink
checkpoint scores 7.7 to 9 on its first key and 0 on every other, whose exponentials then round
away from a running sum of 1 in both low dtypes. Each would fail if the
design were wrong (a weight off the grid, a 1 + w that rounds up, a mean square across the midpoint)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref.config import RopeConfig
from infer_ref.conformance.engines.workloads.checkpoints import write_all
from infer_ref.conformance.engines.workloads.numerics_checkpoints import (
    ANCHOR_BELOW,
    ANCHOR_MIDPOINT,
    DESIGNED_FOR,
    GEMMA3_HIDDEN304,
    GEMMA3_ONE_PLUS_W_BF16,
    GEMMA3_ONE_PLUS_W_FP16,
    LLAMA3_RMS_ANCHOR,
    LLAMA3_ROPE_LONG,
    LLAMA3_SOFTMAX_SINK,
    NUMERICS_CHECKPOINTS,
    NUMERICS_STYLE,
    SINK_SCORE_RANGE,
    SINK_TOKEN,
    exact_in,
    is_exact_in,
)
from infer_ref.conformance.profiles import one_thread
from infer_ref.loader import load_model, read_safetensors
from infer_ref.models.common import RMSNorm, rope_inv_freq

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# Half an ulp of 1 relative: the largest error one rounding of 1 + w can make.
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with one_thread():  # the module on one thread
        written = write_all(
            tmp_path_factory.mktemp("numerics"), specs=NUMERICS_CHECKPOINTS, styles=(NUMERICS_STYLE,)
        )
        yield {spec.name: folder for spec, folder in zip(NUMERICS_CHECKPOINTS, written, strict=True)}


def _prompts(vocab: int, count: int, length: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (1, length), generator=gen) for _ in range(count)]


@pytest.mark.parametrize("spec", NUMERICS_CHECKPOINTS, ids=lambda s: s.name)
def test_every_weight_is_exact_in_the_dtypes_the_checkpoint_is_for(
    folders: dict[str, Path], spec: object
) -> None:
    name = spec.name  # type: ignore[attr-defined]
    state = read_safetensors(folders[name])
    for dtype in DESIGNED_FOR[name]:
        off_grid = [k for k, t in state.items() if not is_exact_in(t, DTYPES[dtype])]
        assert not off_grid, f"{name}: not exact in {dtype}: {off_grid}"


def test_exact_in_rounds_onto_both_grids_and_refuses_what_float16_cannot_hold() -> None:
    # 1 + 2^-9 has 10 significant bits: bf16 (8) rounds it to 1; 3 * 2^-20 is below fp16's normal
    # range (2^-14) with 2 bits, but bf16 leaves it at 3 * 2^-20 and fp16 subnormals hold it exactly.
    values = torch.tensor([1 + 2.0**-9, 3 * 2.0**-20, 2.0**-30 * 1.5])
    out = exact_in(values, (torch.bfloat16, torch.float16))
    assert out.tolist() == [1.0, 3 * 2.0**-20, 0.0]  # 1.5 * 2^-30 is below fp16's smallest subnormal
    with pytest.raises(ValueError, match="cannot be held in torch.float16"):
        exact_in(torch.tensor([70000.0]), (torch.bfloat16, torch.float16))


@pytest.mark.parametrize(
    ("spec", "dtype"), [(GEMMA3_ONE_PLUS_W_BF16, torch.bfloat16), (GEMMA3_ONE_PLUS_W_FP16, torch.float16)]
)
def test_every_gemma_norms_one_plus_w_rounds_down_by_nearly_half_an_ulp(
    folders: dict[str, Path], spec: object, dtype: torch.dtype
) -> None:
    state = read_safetensors(folders[spec.name])  # type: ignore[attr-defined]
    norms = {k: t for k, t in state.items() if k.endswith("norm.weight")}
    layers = spec.architecture["num_hidden_layers"]  # type: ignore[attr-defined]
    assert len(norms) == 4 * layers + 2 * layers + 1  # four per block, q/k per block, the final one
    for name, w in norms.items():
        exact = 1.0 + w.double()
        rounded = (1.0 + w.to(dtype)).double()  # the bug: 1 + w added in the weight dtype
        relative = (exact - rounded) / exact
        assert (relative > 0).all(), f"{name}: 1 + w does not round down in {dtype} in every channel"
        assert (relative > 0.9 * HALF_ULP[dtype]).all(), f"{name}: 1 + w rounds by less than 0.9 half-ulp"


def _norm_mean_squares(model: torch.nn.Module, prompts: list[torch.Tensor]) -> torch.Tensor:
    """The mean square (float64, from the input the norm got) of every norm call at every position."""
    seen: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.register_forward_pre_hook(
                lambda _m, args: seen.append(args[0].double().pow(2).mean(-1).flatten())
            )
    with torch.no_grad():
        for ids in prompts:
            model(ids)
    return torch.cat(seen)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_every_llama_norms_mean_square_sits_just_below_a_bfloat16_midpoint(
    folders: dict[str, Path], dtype: torch.dtype
) -> None:
    model, config = load_model(folders[LLAMA3_RMS_ANCHOR.name], dtype=dtype, device="cpu")
    ms = _norm_mean_squares(model, _prompts(config.vocab_size, 6, 80))
    assert ms.numel() == 6 * 80 * (2 * config.num_hidden_layers + 1)
    low, high = ANCHOR_MIDPOINT - ANCHOR_BELOW, ANCHOR_MIDPOINT
    assert bool(((ms >= low) & (ms < high)).all()), (
        f"mean squares {ms.min():.4f}..{ms.max():.4f}, not in [{low}, {high})"
    )
    # 1536 and 1544 are neighbours in bfloat16 (ulp 8): below the midpoint 1540 every one rounds down to 1536.
    assert set(ms.to(torch.bfloat16).float().tolist()) == {1536.0}
    # The pitfall: rsqrt(ms) near a power of two makes the canonical w * round(x * rstd) as coherent
    # as the bug. log2 of the RMS (39.24) is 5.29: 0.29 of an octave from the nearest power.
    log2_rms = 0.5 * torch.log2(ms)
    assert float((log2_rms - log2_rms.round()).abs().min()) > 0.25


def test_a_low_precision_rope_frequency_is_a_phase_error_of_a_sixth_radian_at_distance_1000(
    folders: dict[str, Path],
) -> None:
    arch = LLAMA3_ROPE_LONG.architecture
    assert "sliding_window" not in arch and arch["rope_parameters"] == {
        "rope_type": "default",
        "rope_theta": 10_000.0,
    }
    assert arch["max_position_embeddings"] >= 2048
    inv_freq = rope_inv_freq(arch["head_dim"], RopeConfig(theta=10_000.0), torch.float64)
    phase = {d: float((inv_freq.to(dt).double() - inv_freq).abs().max()) * 1000 for d, dt in DTYPES.items()}
    # 1e4^(-2/32) = 0.56234 is 0.5625 in bf16 and 0.56250 in fp16 too (0.000159 off); 1e4^(-4/32)
    # = 0.31623 is 0.31641 in bf16 (0.000178): times 1000 positions, a sixth of a radian.
    assert phase["bfloat16"] > 0.15 and phase["float16"] > 0.15
    # And the far context decides: 50 tokens changed 950 positions back move the last logprobs.
    model, config = load_model(folders[LLAMA3_ROPE_LONG.name], dtype=torch.float64, device="cpu")
    ids = _prompts(config.vocab_size, 1, 1000)[0]
    changed = ids.clone()
    changed[0, :50] = (changed[0, :50] + 1) % config.vocab_size
    with torch.no_grad():
        moved = (model(ids)[0, -1].log_softmax(-1) - model(changed)[0, -1].log_softmax(-1)).abs().max()
    assert float(moved) > 0.1


def test_sqrt_hidden_is_inexact_in_both_low_dtypes() -> None:
    hidden = GEMMA3_HIDDEN304.architecture["hidden_size"]
    exact = math.sqrt(hidden)
    rounded = {d: float(torch.tensor(exact, dtype=dt)) for d, dt in DTYPES.items()}
    assert rounded == {"bfloat16": 17.375, "float16": 17.4375}  # -0.35% and +0.011% of 17.4356
    assert all(abs(r - exact) / exact > 1e-4 for r in rounded.values())


def test_every_query_scores_the_sink_alone_in_every_layer(folders: dict[str, Path]) -> None:
    from infer_ref.conformance.engines import recipes
    from infer_ref.conformance.engines.numerics_workload import prompt_set

    model, config = load_model(folders[LLAMA3_SOFTMAX_SINK.name], dtype=torch.float64, device="cpu")
    scores: list[torch.Tensor] = []  # [B, H, T, S] per layer and prompt

    def recorded(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        scores.append(recipes._scores(q, k, mask, scale))
        return recipes.eager_attention(q, k, v, mask, scale)

    recipes.with_attention(recorded)(model)
    prompts = prompt_set(LLAMA3_SOFTMAX_SINK).prompts(config.vocab_size)
    assert all(p[0] == SINK_TOKEN and SINK_TOKEN not in p[1:] for p in prompts)
    with torch.no_grad():
        for ids in prompts[:8]:
            model(torch.tensor([ids]))
    assert len(scores) == 8 * config.num_hidden_layers
    for s in scores:
        sink = s[..., 1:, 0]  # every query but the sink's own, on the sink
        assert SINK_SCORE_RANGE[0] < float(sink.min()) and float(sink.max()) < SINK_SCORE_RANGE[1]
        others = s[..., 1:]
        assert bool((others[torch.isfinite(others)] == 0).all())  # exactly 0: one exponential for all


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_non_sink_exponential_rounds_away_from_a_running_sum_of_one(dtype: torch.dtype) -> None:
    # exp(-7.7) = 4.5e-4 is below half an ulp of 1 (2^-8 in bfloat16, 2^-11 = 4.9e-4 in float16), and
    # exp(-9) = 1.2e-4 is not 0: a running sum in the dtype stays at 1 after 120 of them.
    for score in SINK_SCORE_RANGE:
        term = torch.tensor(math.exp(-score), dtype=dtype)
        assert 0 < float(term) < HALF_ULP[dtype]
        total = torch.ones((), dtype=dtype)
        for _ in range(120):
            total = total + term
        assert float(total) == 1.0


def test_prompts_with_a_first_token_refuse_one_outside_the_vocabulary() -> None:
    from infer_ref.conformance.engines.numerics_workload import PromptSet

    with pytest.raises(ValueError, match="first token 500 is outside the vocabulary \\[0, 439\\)"):
        PromptSet(count=1, lengths=(4, 4), seed=0, first_token=500).prompts(439)


@pytest.mark.parametrize("spec", NUMERICS_CHECKPOINTS, ids=lambda s: s.name)
def test_transformers_reads_each_as_infer_ref_does(folders: dict[str, Path], spec: object) -> None:
    # The tier's oracle is transformers in float64: the edited weights and configs must mean the
    # same model to it (float64 agreement to 1e-9; a misread norm or scale moves logprobs by > 1e-3).
    pytest.importorskip("transformers")
    from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs

    folder = folders[spec.name]  # type: ignore[attr-defined]
    model, config = load_model(folder, dtype=torch.float64, device="cpu")
    ids = _prompts(config.vocab_size, 1, 40)[0]
    with torch.no_grad():
        ours = model(ids)[0].log_softmax(-1)
    assert torch.allclose(oracle_logprobs(folder, ids[0].tolist()), ours, atol=1e-9, rtol=0)


@pytest.mark.parametrize("long_context", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_tier_checkpoint_has_a_calibration_with_a_spread(dtype: str, long_context: bool) -> None:
    # The tier judges tier_checkpoints(dtype) against recipe_calibration.json: a checkpoint added or
    # a dtype designed without rerunning recipe_power would otherwise meet a KeyError mid-run. The
    # long prompts (past the default geometry's 256 positions) go to the long-context workload only.
    from infer_ref.conformance.engines.numerics_workload import calibration_for, tier_checkpoints

    specs = tier_checkpoints(dtype, long_context=long_context)
    assert specs and all(s.name.endswith("rope-long") == long_context for s in specs)
    judged = (
        ("slope", "chosen_error", "kl_mean", "kl_late_early") if long_context else ("slope", "chosen_error")
    )
    for spec in specs:
        calibration = calibration_for(spec.name, dtype)
        assert all(calibration[name].spread > 0 for name in judged), (spec.name, calibration)


def test_a_checkpoint_without_calibration_is_named_with_the_command() -> None:
    from infer_ref.conformance.engines.numerics_workload import calibration_for

    table = {"command": "python -m infer_ref.conformance.engines.recipe_power", "calibration": {}}
    with pytest.raises(KeyError, match="no recipe calibration for x in bfloat16: run python -m"):
        calibration_for("x", "bfloat16", table)
