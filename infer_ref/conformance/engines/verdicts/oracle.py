"""The engine tier's oracle: transformers in float64 on the engine's own checkpoint folder, its
float32 norm and RoPE casts lifted and attention through SDPA (softmax in float64): the model's
definition computed in float64 (:mod:`~infer_ref.conformance.oracles.float64_definition`).

Every logprob an engine returns for a position is compared with the log-softmax of transformers'
float64 logits at that position, teacher-forced on the engine's own tokens (prompt + what it
generated): a divergence at step 3 does not hide what the engine computed at step 10.

Tolerances (:func:`~infer_ref.conformance.engines.verdicts.tolerances.agreement_tolerance`) are by the
engine's dtype. Each is the oracle's distance
from a correct computation in that dtype, measured on the kit's checkpoints (docs/conformance.md,
"Engine tier tolerances"), with room for longer sequences, and far below what the planted engine
bugs produce (a shifted position or a stale block moves logprobs by nats, not thousandths).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.engines.protocol import TokenLogprobs
from infer_ref.conformance.oracles.float64_definition import lift_float32_casts

_MODELS: OrderedDict[str, Any] = OrderedDict()
_MODELS_KEPT = 4
_LOGPROBS: OrderedDict[tuple[str, tuple[int, ...]], Tensor] = OrderedDict()
_LOGPROBS_KEPT = 512


def oracle_model(model_dir: str | Path) -> Any:
    """transformers' ``AutoModelForCausalLM`` of ``model_dir`` in float64, every step in float64
    (memoised per folder)."""
    from transformers import AutoModelForCausalLM

    key = str(Path(model_dir).resolve())
    if key not in _MODELS:
        # SDPA, not eager: eager attention takes its softmax in float32 whatever the model's dtype.
        model = AutoModelForCausalLM.from_pretrained(key, dtype=torch.float64, attn_implementation="sdpa")
        hf_config = json.loads((Path(key) / "config.json").read_text())
        _MODELS[key] = lift_float32_casts(model.eval(), hf_config)
        while len(_MODELS) > _MODELS_KEPT:
            _MODELS.popitem(last=False)
    _MODELS.move_to_end(key)
    return _MODELS[key]


@torch.inference_mode()
def oracle_logprobs(model_dir: str | Path, tokens: Sequence[int]) -> Tensor:
    """Float64 log-softmax ``[T, V]`` of transformers' full forward over ``tokens``: row ``i`` is the
    distribution of the token at position ``i + 1`` given tokens ``0..i`` (memoised)."""
    key = (str(Path(model_dir).resolve()), tuple(int(t) for t in tokens))
    if key not in _LOGPROBS:
        logits = oracle_model(model_dir)(torch.tensor([key[1]], dtype=torch.long)).logits[0]  # [T, V]
        _LOGPROBS[key] = torch.log_softmax(logits.double(), dim=-1)
        while len(_LOGPROBS) > _LOGPROBS_KEPT:
            _LOGPROBS.popitem(last=False)
    _LOGPROBS.move_to_end(key)
    return _LOGPROBS[key]


@dataclass(frozen=True)
class Disagreement:
    """One position where an engine's logprobs left the oracle's tolerance."""

    where: str  # "step 3" or "prompt position 7"
    token: int
    engine: float
    oracle: float
    what: str  # "logprob" or "chosen token"

    def __str__(self) -> str:
        gap = "nan" if math.isnan(self.engine) else f"{abs(self.engine - self.oracle):.3g}"
        values = f"engine {self.engine:.6f}, oracle {self.oracle:.6f} (|diff| {gap})"
        return f"{self.where}: {self.what} of token {self.token}: {values}"


def compare_position(
    where: str, entry: TokenLogprobs, row: Tensor, tol: float, *, chosen: bool
) -> list[Disagreement]:
    """``entry`` (the engine's view of one position) against the oracle's log-softmax ``row`` ``[V]``.

    Every returned logprob must be within ``tol`` of the oracle's. For a token the engine *chose*
    greedily (``chosen``), the oracle must rank it first up to ``tol``: a different argmax is a
    near-tie only when the oracle's top two are that close.
    """
    out = []
    pairs = [(entry.token, entry.logprob), *entry.top]
    for token, logprob in pairs:
        if not 0 <= token < row.shape[0]:
            out.append(Disagreement(where, token, logprob, float("nan"), "token id outside the vocabulary"))
            continue
        expected = float(row[token])
        if not (abs(logprob - expected) <= tol):  # NaN fails too
            out.append(Disagreement(where, token, logprob, expected, "logprob"))
    if chosen and 0 <= entry.token < row.shape[0]:
        best = float(row.max())
        if float(row[entry.token]) < best - tol:
            out.append(
                Disagreement(
                    where,
                    entry.token,
                    float(row[entry.token]),
                    best,
                    "chosen token (oracle's argmax scores higher)",
                )
            )
    return out


def distance_from_oracle(entry: TokenLogprobs, row: Tensor) -> float:
    """The largest |engine - oracle| over the logprobs ``entry`` reports (the chosen token's and
    its top-k) against the oracle's log-softmax ``row`` ``[V]``; ids outside the vocabulary are
    :func:`compare_position`'s to report, not a distance."""
    pairs = [(entry.token, entry.logprob), *entry.top]
    return max((abs(lp - float(row[t])) for t, lp in pairs if 0 <= t < row.shape[0]), default=0.0)


def dedupe(found: list[Disagreement]) -> list[Disagreement]:
    """One disagreement per (position, token), in order."""
    seen: set[tuple[str, int, str]] = set()
    out = []
    for d in found:
        if (d.where, d.token, d.what) not in seen:
            seen.add((d.where, d.token, d.what))
            out.append(d)
    return out
