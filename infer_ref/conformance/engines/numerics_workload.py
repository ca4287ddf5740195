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

from infer_ref.conformance.engines.checkpoints import EngineCheckpoint
from infer_ref.conformance.engines.numerics_checkpoints import (
    DESIGNED_FOR,
    LLAMA3_ROPE_LONG,
    NUMERICS_CHECKPOINTS,
)
from infer_ref.conformance.engines.signed_statistics import Calibration

CALIBRATION = Path(__file__).with_name("recipe_calibration.json")
TOP_K = 5  # prompt logprobs asked per position
LONG_BLOCK = 64  # positions per cluster on a long prompt (neighbouring positions are not independent)
# What the tier judges on the numerics checkpoints: the signed statistics (KL is judged by the
# distribution thresholds on the other checkpoints; the KL trend needs the long prompts).
TIER_JUDGED = ("slope", "chosen_error")


@dataclass(frozen=True)
class PromptSet:
    """``count`` prompts of lengths drawn from ``lengths`` (inclusive), from ``seed``."""

    count: int
    lengths: tuple[int, int]
    seed: int

    def prompts(self, vocab_size: int) -> list[tuple[int, ...]]:
        gen = torch.Generator().manual_seed(self.seed)
        lengths = torch.randint(self.lengths[0], self.lengths[1] + 1, (self.count,), generator=gen)
        return [tuple(torch.randint(0, vocab_size, (int(n),), generator=gen).tolist()) for n in lengths]

    @property
    def long(self) -> bool:
        return self.lengths[0] >= 2 * LONG_BLOCK


SHORT = PromptSet(count=24, lengths=(24, 96), seed=52)
LONG = PromptSet(count=4, lengths=(1000, 1040), seed=53)


def prompt_set(spec: EngineCheckpoint) -> PromptSet:
    return LONG if spec.name == LLAMA3_ROPE_LONG.name else SHORT


def tier_checkpoints(dtype: str) -> list[EngineCheckpoint]:
    """The numerics checkpoints the tier's default workload judges in ``dtype``: those designed for
    it whose prompts fit the default geometry (the long RoPE one belongs to the long workload)."""
    return [s for s in NUMERICS_CHECKPOINTS if dtype in DESIGNED_FOR[s.name] and not prompt_set(s).long]


def cluster_of(long: bool, request: int, position: int) -> tuple[int, int] | int:
    """The cluster of a position: its request, or on a long prompt its block of :data:`LONG_BLOCK`."""
    return (request, position // LONG_BLOCK) if long else request


def oracle_rows(logprobs: Tensor) -> Tensor:
    """``[T, V]`` log-softmax of a forward over a prompt -> the rows that predict positions 1..T-1."""
    return logprobs[:-1]


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
            f"no recipe calibration for {checkpoint} in {dtype}: run {table.get('command', 'the calibration')}"
        ) from None
    return {name: Calibration(c["centre"], c["spread"]) for name, c in entry.items()}
