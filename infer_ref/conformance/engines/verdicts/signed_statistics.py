"""Signed, structured statistics of an engine's logprobs against the float64 oracle's, with standard errors.

KL, the largest logprob error and top-1 agreement measure the *size* of an engine's deviation; a
low-precision recipe error is no larger than a correct engine's rounding, and only its *structure*
tells it apart: it points the same way at every position (a temperature of the logits, a norm
scale) or grows with the query-key distance (RoPE). These statistics measure that structure:

- :func:`temperature_slope`: at each position, over the tokens the engine returned, the slope
  ``B`` of the engine's logprob error against the oracle's logprob (both centred per position).
  Engine logits that are the oracle's times ``s`` give ``B = s - 1``; incoherent rounding gives
  ``B`` near 0 within its standard error.
- :func:`mean_with_se` of the chosen token's signed logprob error (the engine's minus the
  oracle's): llama.cpp's mean delta-p, in logprobs.
- :func:`late_early_ratio`: the mean KL of the last third of positions over the first third; an
  error that grows with distance gives a ratio above the correct engines'.

Every standard error is cluster-robust: positions of one request (or one block of a long
prompt) are not independent, so the clusters the caller names are the units of the variance.
Correct engines are themselves biased against the oracle (every one shares the dtype's rounding of
the same recipe), so an estimate is judged by its deviation from a calibrated centre
(:func:`judge`), never by its distance from 0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from infer_ref.conformance.engines.protocol import TokenLogprobs

# An effect-size margin of this many calibrated spreads and a t beyond this are both needed to
# call a deviation a recipe error (the tier's 3x rule for thresholds; |t| > 5 keeps the chance of a
# correct engine crossing by noise below 1e-6 per statistic).
MARGIN_SPREADS = 3.0
T_MIN = 5.0


@dataclass(frozen=True)
class Estimate:
    """A statistic and its standard error."""

    value: float
    se: float

    def t_from(self, centre: float) -> float:
        """How many standard errors the value lies from ``centre`` (inf when the SE is 0 and it differs)."""
        if self.se > 0:
            return (self.value - centre) / self.se
        return 0.0 if self.value == centre else math.copysign(math.inf, self.value - centre)


# One position an engine reported: (cluster, its TokenLogprobs, the oracle's log-softmax row [V]).
Reported = tuple[Hashable, TokenLogprobs, Tensor]


@dataclass(frozen=True)
class SlopeRow:
    """One position: the logprobs of the tokens the engine returned (its top-k and the chosen one),
    as the engine gave them and as the oracle gives them, ``[k]`` each; ``cluster`` names the
    request (or block) the position belongs to."""

    cluster: Hashable
    oracle: Tensor
    engine: Tensor


def temperature_slope(rows: Sequence[SlopeRow]) -> Estimate:
    """The pooled slope ``B = sum(x y) / sum(x^2)`` with ``x`` the oracle's logprobs and ``y`` the
    engine's error, both centred per position, and its cluster-robust (sandwich) standard error
    ``sqrt(sum_c (sum_{i in c} x_i (y_i - B x_i))^2) / sum(x^2)``."""
    if not rows:
        raise ValueError("temperature_slope needs at least one position")
    xs, ys, clusters = [], [], []
    for row in rows:
        oracle, engine = row.oracle.double(), row.engine.double()
        if oracle.shape != engine.shape or oracle.dim() != 1:
            raise ValueError(
                f"a slope row needs oracle and engine logprobs of one shape [k]: got {tuple(oracle.shape)} "
                f"and {tuple(engine.shape)}"
            )
        error = engine - oracle
        xs.append(oracle - oracle.mean())
        ys.append(error - error.mean())
        clusters.append(row.cluster)
    sxx = sum(float((x * x).sum()) for x in xs)
    if sxx == 0:
        raise ValueError("temperature_slope is undefined: the oracle's logprobs are equal at every position")
    slope = sum(float((x * y).sum()) for x, y in zip(xs, ys, strict=True)) / sxx
    scores: dict[Hashable, float] = {}
    for x, y, cluster in zip(xs, ys, clusters, strict=True):
        scores[cluster] = scores.get(cluster, 0.0) + float((x * (y - slope * x)).sum())
    return Estimate(slope, math.sqrt(sum(s * s for s in scores.values())) / sxx)


def mean_with_se(values: Sequence[float], clusters: Sequence[Hashable]) -> Estimate:
    """The mean of ``values`` and its cluster-robust standard error ``sqrt(sum_c (sum_{i in c}
    (v_i - mean))^2) / n`` (the plain standard error when every value is its own cluster)."""
    if len(values) != len(clusters):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    if not values:
        raise ValueError("mean_with_se needs at least one value")
    mean = sum(values) / len(values)
    sums: dict[Hashable, float] = {}
    for v, c in zip(values, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + (v - mean)
    return Estimate(mean, math.sqrt(sum(s * s for s in sums.values())) / len(values))


def late_early_ratio(kl: Sequence[float], positions: Sequence[int], clusters: Sequence[Hashable]) -> Estimate:
    """Mean KL over the last third of the positions' range over the mean over the first third,
    with the delta-method standard error of the ratio (each mean's error cluster-robust)."""
    if not (len(kl) == len(positions) == len(clusters)):
        raise ValueError(
            f"{len(kl)} KL values, {len(positions)} positions and {len(clusters)} cluster labels"
        )
    if not kl:
        raise ValueError("late_early_ratio needs at least one position")
    low, high = min(positions), max(positions)
    third = (high - low) / 3
    early = [i for i, p in enumerate(positions) if p < low + third]
    late = [i for i, p in enumerate(positions) if p > high - third]
    if not early or not late:
        raise ValueError(f"positions {low}..{high} span too little to have a first and a last third")
    e = mean_with_se([kl[i] for i in early], [clusters[i] for i in early])
    lt = mean_with_se([kl[i] for i in late], [clusters[i] for i in late])
    if e.value <= 0:
        raise ValueError("late_early_ratio is undefined: the mean KL of the first third is not positive")
    ratio = lt.value / e.value
    return Estimate(ratio, abs(ratio) * math.hypot(lt.se / max(abs(lt.value), 1e-300), e.se / e.value))


# -- what an engine reported ------------------------------------------------------------------------------


def engine_signed_statistics(positions: Sequence[Reported]) -> dict[str, float | None]:
    """The temperature slope and the chosen token's signed error of an engine's reported positions
    (each ``(cluster, what the engine reported, the oracle's log-softmax row [V])``), each with its
    standard error: ``slope``, ``slope_se``, ``chosen_error``, ``chosen_error_se``. A statistic no
    position can give is None (the slope of an engine that returns the chosen token alone)."""
    out: dict[str, float | None] = dict.fromkeys(("slope", "slope_se", "chosen_error", "chosen_error_se"))
    rows = [row for row in map(_slope_row, positions) if row is not None]
    if any(float(r.oracle.max() - r.oracle.min()) > 0 for r in rows):
        slope = temperature_slope(rows)
        out.update(slope=slope.value, slope_se=slope.se)
    chosen = [(c, e.logprob - float(row[e.token])) for c, e, row in positions if 0 <= e.token < row.shape[0]]
    if chosen:
        error = mean_with_se([v for _, v in chosen], [c for c, _ in chosen])
        out.update(chosen_error=error.value, chosen_error_se=error.se)
    return out


def _slope_row(position: Reported) -> SlopeRow | None:
    """One reported position as a slope row over the tokens the engine returned (None: fewer than two)."""
    cluster, entry, row = position
    returned = {entry.token: entry.logprob, **dict(entry.top)}
    ids = [t for t in returned if 0 <= t < row.shape[0]]
    if len(ids) < 2:
        return None
    engine = torch.tensor([returned[t] for t in ids], dtype=torch.float64)
    return SlopeRow(cluster, row[ids].double(), engine)


# -- judging against a calibration --------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """A statistic's centre and spread over correct engines: the mean of their values and the
    largest distance of one of them from it."""

    centre: float
    spread: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Calibration:
        if not values:
            raise ValueError("a calibration needs the values of at least one correct engine")
        centre = sum(values) / len(values)
        return cls(centre, max(abs(v - centre) for v in values))


@dataclass(frozen=True)
class Judgement:
    """Where an estimate lies against a calibration: ``spreads`` (its deviation from the centre in
    calibrated spreads), ``t`` (that deviation in its own standard errors), and whether it is a
    recipe error (:func:`judge`)."""

    spreads: float
    t: float
    deviates: bool


def judge(
    estimate: Estimate,
    calibration: Calibration,
    *,
    exact_value: float | None = 0.0,
    margin: float = MARGIN_SPREADS,
    t_min: float = T_MIN,
) -> Judgement:
    """Whether ``estimate`` deviates from ``calibration`` by more than ``margin`` spreads **and**
    ``|t| > t_min``. ``spreads`` and ``t`` are reported from the centre; the verdict measures them
    from the nearest point of the accepted range: the centre alone, or, for a statistic with a value
    an exact engine gives (``exact_value``: 0 for a slope or a signed error; None for a ratio),
    everything between that value and the centre. An engine more exact than the correct recipe is
    never judged deviating (the float32 principle); one past the exact value is, by its distance
    from it."""
    accepted = (calibration.centre, calibration.centre if exact_value is None else exact_value)
    nearest = min(max(estimate.value, min(accepted)), max(accepted))
    judged = _spreads(estimate.value - nearest, calibration.spread)
    deviates = abs(judged) > margin and abs(estimate.t_from(nearest)) > t_min
    spreads = _spreads(estimate.value - calibration.centre, calibration.spread)
    return Judgement(spreads, estimate.t_from(calibration.centre), deviates)


def judge_trend(
    ratio: Estimate,
    ratio_calibration: Calibration,
    kl_mean: Estimate,
    kl_calibration: Calibration,
    **limits: float,
) -> Judgement:
    """:func:`judge` for the KL late/early ratio, which has no exact value: an engine whose KL mean is
    at or below the correct engines' centre is more exact than they are, and its KL too small for a
    trend of it to mean a recipe error, so it never deviates."""
    judged = judge(ratio, ratio_calibration, exact_value=None, **limits)
    if kl_mean.value <= kl_calibration.centre:
        return Judgement(judged.spreads, judged.t, False)
    return judged


def _spreads(deviation: float, spread: float) -> float:
    if spread > 0:
        return deviation / spread
    return math.copysign(math.inf, deviation) if deviation else 0.0
