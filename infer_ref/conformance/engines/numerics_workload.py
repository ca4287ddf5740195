"""The numerics workload: the prompts sent on the numerics checkpoints, and the calibration of the signed
statistics on them.

Both the in-process measurement (``python -m infer_ref.conformance.engines.recipe_power``, which
writes :data:`CALIBRATION`) and the engine tier's ``test_recipe_errors.py`` send these prompts and
read every prompt position's logprobs (the engine's top-5 and the given token), so the centre and
spread calibrated on legitimate recipes apply to what an engine returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.engines.protocol import TokenLogprobs
from infer_ref.conformance.engines.verdicts.distribution import binned_kl
from infer_ref.conformance.engines.verdicts.signed_statistics import (
    Calibration,
    Estimate,
    Judgement,
    engine_signed_statistics,
    judge,
    judge_trend,
    late_early_ratio,
    mean_with_se,
)
from infer_ref.conformance.engines.workloads.checkpoints import EngineCheckpoint
from infer_ref.conformance.engines.workloads.numerics_checkpoints import (
    DESIGNED_FOR,
    LLAMA3_ROPE_LONG,
    LLAMA3_SOFTMAX_SINK,
    NUMERICS_CHECKPOINTS,
    SINK_TOKEN,
)

CALIBRATION = Path(__file__).with_name("recipe_calibration.json")
TOP_K = 5  # prompt logprobs asked per position
LONG_BLOCK = 64  # positions per cluster on a long prompt (neighbouring positions are not independent)
# The statistics of a run on the numerics prompts, and the value an exact engine gives for each
# (None: none; the KL late/early ratio is judged only for an engine whose KL mean is above the centre).
EXACT_VALUES: dict[str, float | None] = {
    "slope": 0.0,
    "chosen_error": 0.0,
    "kl_mean": 0.0,
    "kl_late_early": None,
}
# What the tier judges on the short prompts: the signed statistics (KL size is the distribution
# thresholds' business on the other checkpoints); on the long prompts every statistic.
TIER_JUDGED = ("slope", "chosen_error")


@dataclass(frozen=True)
class PromptSet:
    """``count`` prompts of lengths drawn from ``lengths`` (inclusive), from ``seed``; with a
    ``first_token``, each starts with it and holds it nowhere else."""

    count: int
    lengths: tuple[int, int]
    seed: int
    first_token: int | None = None

    def prompts(self, vocab_size: int) -> list[tuple[int, ...]]:
        gen = torch.Generator().manual_seed(self.seed)
        lengths = torch.randint(self.lengths[0], self.lengths[1] + 1, (self.count,), generator=gen)
        if self.first_token is None:
            return [tuple(torch.randint(0, vocab_size, (int(n),), generator=gen).tolist()) for n in lengths]
        if not 0 <= self.first_token < vocab_size:
            raise ValueError(f"first token {self.first_token} is outside the vocabulary [0, {vocab_size})")
        out = []
        for n in lengths:
            rest = torch.randint(0, vocab_size - 1, (int(n) - 1,), generator=gen)
            rest = rest + (rest >= self.first_token).long()  # every id but the first token's
            out.append((self.first_token, *rest.tolist()))
        return out

    @property
    def long(self) -> bool:
        return self.lengths[0] >= 2 * LONG_BLOCK


SHORT = PromptSet(count=24, lengths=(24, 96), seed=52)
LONG = PromptSet(count=4, lengths=(1000, 1040), seed=53)
# The sink's prompts: longer (the softmax-sum error grows with the number of keys), still short.
SINK = PromptSet(count=24, lengths=(64, 120), seed=56, first_token=SINK_TOKEN)


def prompt_set(spec: EngineCheckpoint) -> PromptSet:
    return {LLAMA3_ROPE_LONG.name: LONG, LLAMA3_SOFTMAX_SINK.name: SINK}.get(spec.name, SHORT)


def tier_checkpoints(dtype: str, *, long_context: bool = False) -> list[EngineCheckpoint]:
    """The numerics checkpoints the tier judges in ``dtype``: those designed for it whose prompts
    fit the workload's geometry (the default one: short prompts; ``long_context``: the long ones)."""
    return [
        s
        for s in NUMERICS_CHECKPOINTS
        if dtype in DESIGNED_FOR[s.name] and prompt_set(s).long == long_context
    ]


def spec_of_folder(name: str) -> EngineCheckpoint:
    """The numerics checkpoint written in folder ``name`` (``<name>-<style>``)."""
    for spec in NUMERICS_CHECKPOINTS:
        if name.startswith(spec.name + "-"):
            return spec
    raise KeyError(
        f"{name} is not a numerics checkpoint folder; known: "
        f"{', '.join(s.name for s in NUMERICS_CHECKPOINTS)}"
    )


def cluster_of(long: bool, request: int, position: int) -> tuple[int, int] | int:
    """The cluster of a position: its request, or on a long prompt its block of :data:`LONG_BLOCK`."""
    return (request, position // LONG_BLOCK) if long else request


def run_statistics(
    positions: list[tuple[int, int, TokenLogprobs, Tensor]], long: bool, *, chosen_only: bool = False
) -> dict[str, Estimate]:
    """The statistics of an engine's prompt logprobs on the numerics prompts: each position as
    ``(request, position, what the engine returned, the oracle's log-softmax row [V] there)``. The
    slope, the chosen token's signed error and the KL mean (the tier's binned KL), each with its
    cluster-robust standard error; on long prompts the KL late/early ratio too.

    ``chosen_only``: the engine returns the chosen token alone (no top-k alternatives): only the
    chosen token's signed error, the one calibrated statistic its answers give (the slope needs two
    returned tokens; a KL binned on the chosen token and the rest is not the calibration's top-5 KL)."""
    reported = [(cluster_of(long, r, p), entry, row) for r, p, entry, row in positions]
    signed = engine_signed_statistics(reported)
    if chosen_only:
        return {"chosen_error": _estimate(signed, "chosen_error")}
    kl = [binned_kl(entry, row) for _, entry, row in reported]
    clusters = [c for c, _, _ in reported]
    out = {
        "slope": _estimate(signed, "slope"),
        "chosen_error": _estimate(signed, "chosen_error"),
        "kl_mean": mean_with_se(kl, clusters),
    }
    if long:
        out["kl_late_early"] = late_early_ratio(kl, [p for _, p, _, _ in positions], clusters)
    return out


def _estimate(signed: dict[str, float | None], name: str) -> Estimate:
    value, se = signed[name], signed[f"{name}_se"]
    if value is None or se is None:
        raise ValueError(
            f"{name} needs two returned tokens at some position: the engine returned its chosen token alone"
        )
    return Estimate(value, se)


def judge_run(stats: dict[str, Estimate], calibration: dict[str, Calibration]) -> dict[str, Judgement]:
    """Each of ``stats`` judged against its calibration (:data:`EXACT_VALUES`; the KL trend by
    :func:`~infer_ref.conformance.engines.verdicts.signed_statistics.judge_trend`)."""
    judged = {
        name: judge(est, calibration[name], exact_value=EXACT_VALUES[name])
        for name, est in stats.items()
        if name != "kl_late_early"
    }
    if "kl_late_early" in stats:
        judged["kl_late_early"] = judge_trend(
            stats["kl_late_early"], calibration["kl_late_early"], stats["kl_mean"], calibration["kl_mean"]
        )
    return judged


def load_calibration(path: Path = CALIBRATION) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def calibration_for(
    checkpoint: str, dtype: str, table: dict[str, Any] | None = None
) -> dict[str, Calibration]:
    """Each statistic's calibrated centre and spread on ``checkpoint`` in ``dtype``."""
    table = load_calibration() if table is None else table
    try:
        entry = table["calibration"][checkpoint][dtype]
    except KeyError:
        raise KeyError(
            f"no recipe calibration for {checkpoint} in {dtype}: run "
            f"{table.get('command', 'the calibration')}"
        ) from None
    return {name: Calibration(c["centre"], c["spread"]) for name, c in entry.items()}


def numerics_model_dirs(dtype: str, *, long_context: bool = False) -> list[Path]:
    """The numerics checkpoints the workload judges in ``dtype`` (``long_context``: those of long
    prompts), written on first use and cached beside the engine checkpoints; none in float32 and
    float64, where no recipe error exists. None without the fixtures."""
    from infer_ref.conformance.engines.workloads.checkpoints import FIXTURE_CHECKPOINTS, write_all
    from infer_ref.conformance.engines.workloads.folders import engine_checkpoints_root
    from infer_ref.conformance.engines.workloads.numerics_checkpoints import NUMERICS_STYLE

    specs = tier_checkpoints(dtype, long_context=long_context)
    if not specs or not FIXTURE_CHECKPOINTS.is_dir():
        return []
    return write_all(engine_checkpoints_root(), specs=specs, styles=(NUMERICS_STYLE,))
