"""The low-precision verdict: how far an engine's distributions sit from the oracle's, summarised
over every position it reports, the way llama.cpp's perplexity tool summarises a quantised model.

In bfloat16 and float16 a correct engine's logprob at its worst position is tenths of a nat from
float64 (rounding of 8- or 11-bit mantissas through every layer), so the float32 rule "every
logprob within a tolerance" could only accept anything under a nat. A wrong engine differs in
*distribution*, not only at one position: a bug moves many positions a little or a few positions a
lot. Per position (:func:`position_stats`):

- ``logprob_error``: |engine - oracle| logprob of the chosen token (teacher-forced: the oracle runs
  the engine's own tokens);
- ``kl``: KL(oracle || engine) over the tokens the engine returned (its chosen token and top-k) plus
  one bin for the rest of the vocabulary (:func:`binned_kl`);
- ``same_top``: whether the engine's most likely token is the oracle's.

Per engine x checkpoint x dtype, :class:`Summary` keeps the mean, median, 99th percentile and
maximum KL, the mean and maximum logprob error, and the share of positions with the same top token;
:func:`judge` compares them with thresholds calibrated on correct implementations in that dtype
(:mod:`~infer_ref.conformance.engines.verdicts.thresholds`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from infer_ref.conformance.engines.protocol import TokenLogprobs

# The engine's probabilities over the tokens it returned may add up to a little over 1 (each
# logprob rounded in its own dtype), leaving nothing for the rest bin: the rest is then taken as
# this much, so a rest the oracle gives mass to costs a bounded, visible amount, not infinity.
REST_FLOOR = 1e-9


@dataclass(frozen=True)
class PositionStat:
    """One position an engine reported, against the oracle."""

    request: int  # index in the workload
    where: str  # "step 3" or "prompt position 7"
    prompt_len: int
    logprob_error: float
    kl: float
    same_top: bool


def binned_kl(entry: TokenLogprobs, row: Tensor) -> float:
    """KL(oracle || engine) in nats over the bins {each token the engine returned} + {the rest}.

    The oracle's probabilities come from its full log-softmax ``row`` ``[V]``; the engine's from the
    logprobs it returned, its rest bin ``1 - sum`` (at least :data:`REST_FLOOR`). Coarsening both
    distributions onto the same bins can only lower KL (the log-sum inequality), so this estimates
    the full-vocabulary KL from below, exactly when the returned tokens hold all the mass: a bug it
    reports is real; a bug confined to tokens outside an engine's top-k shows only through the rest
    bin. With no top-k (one logprob per position) it is the KL of {chosen, not chosen}.
    """
    returned = {entry.token: entry.logprob, **dict(entry.top)}
    ids = [t for t in returned if 0 <= t < row.shape[0]]
    if not ids:
        return math.inf
    p = row[ids].exp()  # [K] float64, the oracle's probabilities of the returned tokens
    q = torch.tensor([returned[t] for t in ids], dtype=torch.float64).exp()  # [K]
    p_rest = max(0.0, 1.0 - float(p.sum()))
    q_rest = max(REST_FLOOR, 1.0 - float(q.sum()))
    if not bool(torch.isfinite(q).all()):
        return math.inf
    kl = float(torch.where(p > 0, p * (p.log() - q.log()), torch.zeros_like(p)).sum())
    if p_rest > 0:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(kl, 0.0)  # rounding in the sums can leave -1e-17


def position_stats(
    request: int, where: str, prompt_len: int, entry: TokenLogprobs, row: Tensor
) -> PositionStat:
    """``entry`` (the engine at one position) against the oracle's log-softmax ``row`` ``[V]``."""
    in_vocab = 0 <= entry.token < row.shape[0]
    error = abs(entry.logprob - float(row[entry.token])) if in_vocab else math.inf
    if math.isnan(error):
        error = math.inf
    engine_top = entry.top[0][0] if entry.top else entry.token
    return PositionStat(
        request, where, prompt_len, error, binned_kl(entry, row), engine_top == int(row.argmax())
    )


@dataclass(frozen=True)
class Summary:
    """An engine's positions on one checkpoint in one dtype, summarised."""

    positions: int
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    logprob_error_mean: float
    logprob_error_max: float
    same_top: float  # share of positions, 0..1

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


STATISTICS = (
    "kl_mean",
    "kl_median",
    "kl_p99",
    "kl_max",
    "logprob_error_mean",
    "logprob_error_max",
    "same_top",
)
# Higher is worse for every statistic but the share of same top tokens.
LOWER_IS_WORSE = frozenset({"same_top"})


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ascending ``sorted_values`` (nearest rank: a value that occurred)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def summarise(stats: Sequence[PositionStat]) -> Summary:
    """The summary of ``stats`` (at least one position)."""
    if not stats:
        raise ValueError("no positions to summarise: the engine reported no logprob the oracle could judge")
    kl = sorted(s.kl for s in stats)
    errors = [s.logprob_error for s in stats]
    return Summary(
        positions=len(stats),
        kl_mean=math.fsum(kl) / len(kl),
        kl_median=quantile(kl, 0.5),
        kl_p99=quantile(kl, 0.99),
        kl_max=kl[-1],
        logprob_error_mean=math.fsum(errors) / len(errors),
        logprob_error_max=max(errors),
        same_top=sum(s.same_top for s in stats) / len(stats),
    )


@dataclass(frozen=True)
class Exceeded:
    """A statistic past its threshold, with the positions that drove it."""

    statistic: str
    value: float
    threshold: float
    worst: tuple[PositionStat, ...]

    def __str__(self) -> str:
        side = "below" if self.statistic in LOWER_IS_WORSE else "above"
        head = f"{self.statistic} {self.value:.4g} is {side} its threshold {self.threshold:.4g}"
        return head + "; worst positions: " + "; ".join(_describe(p) for p in self.worst)


def judge(
    stats: Sequence[PositionStat], thresholds: dict[str, float], worst: int = 3
) -> tuple[Summary, list[Exceeded]]:
    """``stats`` summarised, and every statistic of ``thresholds`` it passes (higher than the
    threshold, or lower for :data:`LOWER_IS_WORSE`), each with its ``worst`` positions."""
    summary = _checked(summarise(stats))
    found = []
    for name, threshold in thresholds.items():
        value = getattr(summary, name)
        bad = value < threshold if name in LOWER_IS_WORSE else not value <= threshold
        if bad:
            found.append(Exceeded(name, value, threshold, worst_positions(stats, name, worst)))
    return summary, found


def worst_positions(stats: Sequence[PositionStat], statistic: str, n: int = 3) -> tuple[PositionStat, ...]:
    """The ``n`` positions that drove ``statistic``: the largest logprob errors for the error
    statistics, top-token disagreements (largest KL first) for ``same_top``, the largest KL otherwise."""
    if statistic.startswith("logprob_error"):
        return tuple(sorted(stats, key=lambda s: -s.logprob_error)[:n])
    pool = [s for s in stats if not s.same_top] if statistic == "same_top" else list(stats)
    return tuple(sorted(pool, key=lambda s: -s.kl)[:n])


def _checked(summary: Summary) -> Summary:
    for name in STATISTICS:
        if math.isnan(getattr(summary, name)):
            raise AssertionError(f"{name} is NaN: the engine returned a NaN logprob")
    return summary


def _describe(p: PositionStat) -> str:
    top = "same top token" if p.same_top else "another top token"
    where = f"request {p.request} ({p.prompt_len} prompt tokens) {p.where}"
    return f"{where}: KL {p.kl:.3g}, logprob error {p.logprob_error:.3g}, {top}"


__all__ = [
    "LOWER_IS_WORSE",
    "REST_FLOOR",
    "STATISTICS",
    "Exceeded",
    "PositionStat",
    "Summary",
    "binned_kl",
    "judge",
    "position_stats",
    "quantile",
    "summarise",
    "worst_positions",
]
