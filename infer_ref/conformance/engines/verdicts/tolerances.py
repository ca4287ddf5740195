"""Every tolerance of the engine tier, and the dtype policy: the oracle's (:func:`agreement_tolerance`,
by dtype, growing with a float32 request's length) and self-consistency's, measured on each engine
between two correct schedules of it (:func:`consistency_tolerance`). bfloat16 and float16
(:data:`LOW_PRECISION`) are judged by distribution
(:mod:`~infer_ref.conformance.engines.verdicts.thresholds`).

Two schedules of one request (alone or in a batch, whole or chunked prefill, cold or warm prefix
cache) run the same model on the same engine; they differ only in how the arithmetic is grouped.
The tolerance for "same answer" is that rounding spread, measured — far tighter than the oracle's
tolerance, which must also cover the engine's distance from transformers. An engine slightly off
transformers still has its caching judged at its own precision.

:data:`MEASURED_SPREAD` holds, per ``(engine, dtype)``, the largest difference between two
schedules seen over the whole tier (every checkpoint, every self-consistency test; each run prints
it). The tolerance is :data:`MARGIN` times that, at least :data:`FLOOR`, never above the oracle's.
An engine not in the table (a user's own, an endpoint) is judged at the oracle tolerance until it
is measured: the run's own largest difference is printed, and ``--ir-consistency-tolerance``
takes the value chosen from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer_ref.conformance.engines.registry import RECORDS

LOW_PRECISION = ("bfloat16", "float16")  # judged by distribution; the others position by position

# Largest |engine - oracle| logprob difference accepted, by engine dtype (nats). Measured over the
# whole tier (seven checkpoints, every logprob returned), the largest distance of a correct engine:
# float32 3.2e-5 (vLLM; infer_ref's Engine 3.0e-5), room for longer sequences; bfloat16 0.745 and
# float16 0.078 (infer_ref's Engine), twice that. float64: infer_ref is ~1e-13 from this oracle.
AGREEMENT_TOLERANCE = {"float64": 1e-6, "float32": 2e-4, "bfloat16": 1.5, "float16": 0.15}
# float32 rounds a RoPE angle (position x frequency) to about 6e-8 of itself, so a correct engine's
# logprobs drift from the oracle's as positions grow. Measured on the long-context checkpoints
# (transformers' own float32 forward and infer_ref's Engine, both correct): 1.2e-4 nats at 1040
# positions, 3.1e-4 at 8207 (gemma3-long), 2.5e-3 at 8209 (llama3-long: base 500000, gain 2). Past
# the flat tolerance the float32 one grows with the request's length at twice that largest slope
# (3.1e-7 per position): 2e-4 up to 333 positions (the default workload's all), 5e-3 at 8209.
AGREEMENT_SLOPE = {"float32": 6e-7}


def agreement_tolerance(dtype: str, positions: int = 0) -> float:
    """The oracle tolerance for an engine computing in ``dtype``, for a request of ``positions``
    positions in all (prompt and generated; 0: the flat tolerance)."""
    try:
        flat = AGREEMENT_TOLERANCE[dtype]
    except KeyError:
        raise ValueError(
            f"no agreement tolerance for dtype {dtype!r}; known: {', '.join(AGREEMENT_TOLERANCE)}"
        ) from None
    return max(flat, AGREEMENT_SLOPE.get(dtype, 0.0) * positions)


# Largest |logprob difference| between two schedules of one engine over the whole engine tier (7
# checkpoints, both starts), nats, per (engine, dtype): the registry's measured spreads
# (:mod:`~infer_ref.conformance.engines.registry`, where each is explained). The long-context
# workload's are measured the same way, on that workload.
MEASURED_SPREAD: dict[tuple[str, str], float] = {(r.name, d): v for r in RECORDS for d, v in r.spread.items()}
MEASURED_LONG_SPREAD: dict[tuple[str, str], float] = {
    (r.name, d): v for r in RECORDS for d, v in r.long_spread.items()
}
MARGIN = 4.0  # longer prompts and other batch shapes than the tier's may round further apart
# What reordering moves a logprob by at 8000 positions (the largest of the spreads above, 3.5e-5), times
# MARGIN: an engine bitwise alike on the default workload is judged at least this loosely on the long one.
LONG_FLOOR = MARGIN * max(MEASURED_LONG_SPREAD.values())
# What reordering a float32 sum moves a logprob by on these checkpoints (the engines above that do
# reorder: 1.3e-5 to 3.1e-5): an engine bitwise equal here may reorder on another CPU.
FLOOR = 1e-5


@dataclass(frozen=True)
class ConsistencyTolerance:
    """The tolerance self-consistency tests use, and where it comes from (printed in the report)."""

    value: float
    source: str


def consistency_tolerance(
    engine: str | None, dtype: str, given: float | None = None, *, long_context: bool = False
) -> ConsistencyTolerance:
    """The tolerance for ``engine`` (a name of the tier's registry, None for an endpoint or a
    user's factory) computing in ``dtype``; ``given`` (``--ir-consistency-tolerance``) overrides;
    ``long_context``: the long-context workload's (its own spreads, at least :data:`LONG_FLOOR`)."""
    ceiling = agreement_tolerance(dtype)
    if given is not None:
        if not 0 < given <= ceiling:
            raise ValueError(
                f"--ir-consistency-tolerance must be in (0, {ceiling:g}] for {dtype} (the oracle tolerance "
                f"is the loosest), got {given!r}"
            )
        return ConsistencyTolerance(given, "given on the command line")
    if long_context:
        return _long_context_tolerance(engine, dtype, ceiling)
    measured = MEASURED_SPREAD.get((engine or "", dtype))
    if measured is None:
        return ConsistencyTolerance(
            ceiling, f"the oracle tolerance: no spread measured for {engine or 'this engine'} in {dtype}"
        )
    value = min(ceiling, max(FLOOR, MARGIN * measured))
    return ConsistencyTolerance(
        value, f"{MARGIN:g} x the spread measured on {engine} in {dtype} ({measured:.2g})"
    )


def _long_context_tolerance(engine: str | None, dtype: str, ceiling: float) -> ConsistencyTolerance:
    key = (engine or "", dtype)
    measured, where = MEASURED_LONG_SPREAD.get(key), "the long-context workload"
    if measured is None:
        measured, where = MEASURED_SPREAD.get(key), "the default workload"
    if measured is None:
        return ConsistencyTolerance(
            ceiling, f"the oracle tolerance: no spread measured for {engine or 'this engine'} in {dtype}"
        )
    value = min(ceiling, max(LONG_FLOOR, MARGIN * measured))
    return ConsistencyTolerance(
        value,
        f"{MARGIN:g} x the spread measured on {engine} in {dtype} on {where} ({measured:.2g}), "
        f"at least {LONG_FLOOR:g} (reordering over 8000 positions)",
    )
