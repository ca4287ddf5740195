"""The positions agreement with the oracle judges, shared by the tier's agreement verdict and the
low-precision calibration (``python -m infer_ref.conformance.engines.calibrate``), so both judge
exactly the same positions.

:func:`judged_positions` pairs every logprob an engine returned with the oracle's row at its position,
teacher-forced on the engine's own tokens.
float32 and float64 are judged position by position (:func:`disagreements`, the tolerance of
:func:`~infer_ref.conformance.engines.verdicts.tolerances.agreement_tolerance`); bfloat16 and float16 by the
distribution of the positions (:mod:`~infer_ref.conformance.engines.verdicts.distribution`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.verdicts.distribution import PositionStat, position_stats
from infer_ref.conformance.engines.verdicts.oracle import compare_position, dedupe, oracle_logprobs


@dataclass(frozen=True)
class JudgedPosition:
    """One position an engine reported, beside the oracle's log-softmax row ``[V]`` there."""

    request: int
    where: str  # "step 3" or "prompt position 7"
    prompt_len: int
    entry: TokenLogprobs
    row: Tensor
    chosen: bool  # the engine chose this token greedily: the oracle must rank it first
    prompt: bool  # a prompt position (prompt logprobs), not a generated step

    def stat(self) -> PositionStat:
        return position_stats(self.request, self.where, self.prompt_len, self.entry, self.row)


def judged_positions(
    model_dir: Path, index: int, request: EngineRequest, output: EngineOutput
) -> list[JudgedPosition]:
    """Every position the engine reported for ``request``: each generated step, then each prompt
    position past the first."""
    oracle = oracle_logprobs(
        model_dir, (*request.prompt, *output.token_ids)
    )  # [T, V]: row i predicts position i + 1
    n = len(request.prompt)
    out = [
        JudgedPosition(index, f"step {s}", n, e, oracle[n - 1 + s], request.greedy, prompt=False)
        for s, e in enumerate(output.logprobs)
    ]
    out += [
        JudgedPosition(index, f"prompt position {p}", n, e, oracle[p - 1], False, prompt=True)
        for p, e in enumerate(output.prompt_logprobs or ())
        if e is not None
    ]
    return out


def of_kind(positions: list[JudgedPosition], kind: str) -> list[JudgedPosition]:
    """The positions a kind of the low-precision thresholds covers: the ``prompt`` positions, or
    the generated steps (``generated``, ``continued``)."""
    return [p for p in positions if p.prompt == (kind == "prompt")]


def disagreements(positions: list[JudgedPosition], tol: float) -> list[str]:
    """Every one of ``positions`` where the engine's logprobs leave the oracle's tolerance."""
    found = [d for p in positions for d in compare_position(p.where, p.entry, p.row, tol, chosen=p.chosen)]
    return [str(d) for d in dedupe(found)]


__all__ = [
    "JudgedPosition",
    "disagreements",
    "judged_positions",
    "of_kind",
]
