"""Recipe errors in bfloat16 and float16: on the numerics checkpoints (whose weights make a recipe error
point the same way at every position, or grow with the query-key distance), the engine's statistics
against the float64 oracle must lie within 3 calibrated spreads of the legitimate recipes' centre
(or beyond it by less than |t| = 5, or between the centre and the exact value: an engine more exact
than the correct recipes never fails). docs/low-precision.md, "Recipe errors"; the centres and
spreads come from ``python -m infer_ref.conformance.engines.recipe_power``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import Tensor

from infer_ref.conformance.engines.numerics_workload import (
    TIER_JUDGED,
    TOP_K,
    calibration_for,
    judge_run,
    prompt_set,
    run_statistics,
    spec_of_folder,
)
from infer_ref.conformance.engines.protocol import EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.recipes import LEGITIMATE
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import Started
from infer_ref.conformance.engines.verdicts.distribution import position_stats, summarise
from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs

pytestmark = [pytest.mark.ir_oracle("transformers float64"), pytest.mark.ir_numerics]

# What a deviation of each sign suggests (the planted bugs that gave it: docs/low-precision.md).
_SUGGESTS = {
    (
        "slope",
        -1,
    ): "logits flatter than the correct recipes' (a norm scale rounded down: Gemma's 1 + w in the "
    "weight dtype, RMSNorm's mean square rounded in the low dtype, an embedding normaliser rounded)",
    ("slope", +1): "logits sharper than the correct recipes' (a norm scale rounded up: RMSNorm's mean square "
    "rounded in the low dtype, an embedding normaliser rounded; or attention outputs too large: a softmax "
    "sum accumulated in the low dtype)",
    ("kl_late_early", +1): "an error growing with the query-key distance (RoPE frequencies or cos/sin tables "
    "rounded to the low dtype)",
}


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_recipe_statistics_within_calibrated_spread(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Prompt logprobs (top-5) of the numerics prompts on the plain engine: the temperature slope and
    the chosen token's signed error, each with its standard error, judged against the calibration.

    Guards: *RMSNorm accumulated or scaled in low precision*, *Gemma's 1 + w formed in low precision*,
    *attention softmax sum accumulated in low precision*, *residual stream truncated by a fused add +
    norm*, *embed scale not rounded to dtype* (Gemma's normaliser rounded in bfloat16 in a float16
    engine)."""
    _judge_numerics(
        model_dir, engines, started, "test_recipe_statistics_within_calibrated_spread", TIER_JUDGED
    )


@pytest.mark.ir_long_context
@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_recipe_statistics_at_long_distances(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """The long numerics prompts (~1000 positions, RoPE base 1e4 unscaled, no window): the KL mean and
    its late/early ratio (a RoPE error grows with the query-key distance), the temperature slope and
    the chosen token's signed error, judged against the calibration.

    Guards: *RoPE frequencies or angles held in low precision*."""
    _judge_numerics(
        model_dir,
        engines,
        started,
        "test_recipe_statistics_at_long_distances",
        ("slope", "chosen_error", "kl_mean", "kl_late_early"),
    )


def _judge_numerics(
    model_dir: Path, engines: EngineSession, started: Started, test: str, judged_names: tuple[str, ...]
) -> None:
    """Run the checkpoint's numerics prompts, record the statistics in the report, fail on a deviation."""
    work = prompt_set(spec_of_folder(model_dir.name))
    requests = [
        EngineRequest(p, 1, prompt_logprobs=TOP_K) for p in work.prompts(engines.facts(model_dir).vocab_size)
    ]
    requests = engines.judgeable(model_dir, requests)
    outputs = run(started(model_dir, "plain"), requests)
    positions: list[
        tuple[int, int, TokenLogprobs, Tensor]
    ] = []  # (request, position, the engine's, oracle row [V])
    for r, (request, out) in enumerate(zip(requests, outputs, strict=True)):
        oracle = oracle_logprobs(model_dir, request.prompt)  # [T, V]: row i predicts position i + 1
        assert out.prompt_logprobs is not None, f"request {r}: no prompt logprobs returned"
        positions += [(r, p, e, oracle[p - 1]) for p, e in enumerate(out.prompt_logprobs) if e is not None]
    # An engine without top-k alternatives (OpenVINO GenAI: "only single top logprob") is judged on
    # the chosen token's signed error alone, the one calibrated statistic its answers give.
    chosen_only = "top_logprobs" not in engines.capabilities
    stats = run_statistics(positions, work.long, chosen_only=chosen_only)
    calibration = calibration_for(spec_of_folder(model_dir.name).name, engines.settings.dtype)
    everything = judge_run(stats, calibration)
    judged = {name: j for name, j in everything.items() if name in judged_names}
    differences = _recipe_differences_here(engines, model_dir)
    failures = []
    for name, verdict in judged.items():
        if verdict.deviates:
            est, cal = stats[name], calibration[name]
            hint = _SUGGESTS.get((name, 1 if verdict.spreads > 0 else -1))
            failures.append(
                f"{name} {est.value:+.3g} ± {est.se:.2g} is {verdict.spreads:+.1f} spreads (t "
                f"{verdict.t:+.1f}) "
                f"from the correct recipes' centre {cal.centre:+.3g} (spread {cal.spread:.2g})"
                + (f": {hint}" if hint else "")
            )
    summary = summarise([position_stats(r, f"prompt position {p}", 0, e, row) for r, p, e, row in positions])
    signed = {
        k: v
        for name in ("slope", "chosen_error")
        if name in stats
        for k, v in ((name, stats[name].value), (f"{name}_se", stats[name].se))
    }
    engines.ledger.distributions.append(
        {
            "test": test,
            "checkpoint": model_dir.name,
            "kind": "prompt",
            "dtype": engines.settings.dtype,
            **summary.as_dict(),
            **signed,
            "exceeded": [n for n, j in judged.items() if j.deviates],
            "thresholds": {},
            "source": "recipe calibration (docs/low-precision.md, Recipe errors)",
            "recipe_statistics": {
                name: {
                    "value": stats[name].value,
                    "se": stats[name].se,
                    "centre": calibration[name].centre,
                    "spread": calibration[name].spread,
                    "spreads": verdict.spreads,
                    "t": verdict.t,
                    "judged": name in judged,
                    "deviates": name in judged and verdict.deviates,
                }
                for name, verdict in everything.items()
            },
            "recipe_differences": differences,
        }
    )
    if failures and differences:
        failures.append(
            "the engine declares a recipe difference here, which the correct recipes' spread already "
            "holds (a deviation past the margin is more than it): "
            + "; ".join(f"{name} ({why})" for name, why in differences.items())
        )
    assert judged, f"no statistic of {', '.join(judged_names)} could be computed from the engine's answers"
    assert not failures, (
        f"a recipe error on {model_dir.name} in {engines.settings.dtype} ({len(positions)} positions):\n"
        + "\n".join(failures)
    )


def _recipe_differences_here(engines: EngineSession, model_dir: Path) -> dict[str, str]:
    """The legitimate recipes the engine declares it differs in that apply to this checkpoint in
    this dtype (its family, a dtype the recipe differs in), each with why."""
    model_type = json.loads((model_dir / "config.json").read_text())["model_type"]
    recipes = {recipe.name: recipe for recipe in LEGITIMATE}
    return {
        name: why
        for name, why in engines.recipe_differences(model_dir).items()
        if recipes[name].applies_to(model_type, engines.settings.dtype)
    }
