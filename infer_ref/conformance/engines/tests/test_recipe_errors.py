"""Recipe errors in bfloat16 and float16: on the numerics checkpoints (whose weights make a recipe error
point the same way at every position), the engine's temperature slope and chosen-token signed error
against the float64 oracle must lie within 3 calibrated spreads of the legitimate recipes' centre
(or beyond it by less than |t| = 5, or between the centre and the exact value: an engine more exact
than the correct recipes never fails). docs/low-precision.md, "Recipe errors"; the centres and
spreads come from ``python -m infer_ref.conformance.engines.recipe_power``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import Tensor

from infer_ref.conformance.engines.distribution import position_stats, summarise
from infer_ref.conformance.engines.numerics_checkpoints import NUMERICS_STYLE
from infer_ref.conformance.engines.numerics_workload import SHORT, TIER_JUDGED, TOP_K, calibration_for
from infer_ref.conformance.engines.oracle import oracle_logprobs
from infer_ref.conformance.engines.protocol import EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.signed_statistics import (
    Estimate,
    engine_signed_statistics,
    judge,
)

pytestmark = [pytest.mark.ir_oracle("transformers float64"), pytest.mark.ir_numerics]

# What a deviation of each sign suggests (the planted bugs that gave it: docs/low-precision.md).
_SUGGESTS = {
    ("slope", -1): "logits flatter than the correct recipes' (a norm scale rounded down: Gemma's 1 + w in the "
    "weight dtype, RMSNorm's mean square rounded in the low dtype, an embedding normaliser rounded)",
    ("slope", +1): "logits sharper than the correct recipes' (a norm scale rounded up: RMSNorm's mean square "
    "rounded in the low dtype, an embedding normaliser rounded)",
}


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_recipe_statistics_within_calibrated_spread(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Prompt logprobs (top-5) of the numerics prompts on the plain engine: the temperature slope and
    the chosen token's signed error, each with its standard error, judged against the calibration.

    Guards: *RMSNorm accumulated or scaled in low precision*, *Gemma's 1 + w formed in low precision*."""
    requests = [EngineRequest(p, 1, prompt_logprobs=TOP_K) for p in SHORT.prompts(tier.facts(model_dir).vocab_size)]
    requests = tier.judgeable(model_dir, requests)
    prompts = [r.prompt for r in requests]
    outputs = run(started(model_dir, "plain"), requests)
    positions: list[tuple[int, TokenLogprobs, Tensor]] = []  # (request, what the engine returned, oracle row [V])
    for r, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        oracle = oracle_logprobs(model_dir, prompt)  # [T, V]: row i predicts position i + 1
        assert out.prompt_logprobs is not None, f"request {r}: no prompt logprobs returned"
        positions += [(r, e, oracle[p - 1]) for p, e in enumerate(out.prompt_logprobs) if e is not None]
    signed = engine_signed_statistics(positions)
    calibration = calibration_for(model_dir.name.removesuffix(f"-{NUMERICS_STYLE}"), tier.dtype)
    summary = summarise([position_stats(r, "prompt", 0, e, row) for r, e, row in positions])
    failures, judged = [], {}
    for name in TIER_JUDGED:
        value, se = signed[name], signed[f"{name}_se"]
        assert value is not None and se is not None, f"{name}: not computable from the engine's prompt logprobs"
        verdict = judge(Estimate(value, se), calibration[name])
        judged[name] = verdict
        if verdict.deviates:
            sign = 1 if verdict.spreads > 0 else -1
            failures.append(
                f"{name} {value:+.3g} ± {se:.2g} is {verdict.spreads:+.1f} spreads (t {verdict.t:+.1f}) from the "
                f"correct recipes' centre {calibration[name].centre:+.3g} (spread {calibration[name].spread:.2g})"
                + (f": {_SUGGESTS[(name, sign)]}" if (name, sign) in _SUGGESTS else "")
            )
    tier.distributions.append({"test": "test_recipe_statistics_within_calibrated_spread", "checkpoint": model_dir.name,
                               "kind": "prompt", "dtype": tier.dtype, **summary.as_dict(), **signed,
                               "exceeded": [n for n, j in judged.items() if j.deviates], "thresholds": {},
                               "source": "recipe calibration (docs/low-precision.md, Recipe errors)"})  # fmt: skip
    assert not failures, f"a recipe error on {model_dir.name} in {tier.dtype} ({len(positions)} positions):\n" + "\n".join(failures)
