"""The agreement verdict of one engine run: every position the engine reported against the oracle,
position by position in float32/float64, by distribution in bfloat16/float16; a failure raises
with the positions that drove it and a repro. Shared by the agreement tests, the continued
conversations and the calibration's kinds of position.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineTier
from infer_ref.conformance.engines.verdicts.distribution import judge
from infer_ref.conformance.engines.verdicts.oracle import agreement_tolerance, distance_from_oracle
from infer_ref.conformance.engines.verdicts.positions import (
    LOW_PRECISION,
    JudgedPosition,
    disagreements,
    judged_positions,
    of_kind,
)
from infer_ref.conformance.engines.verdicts.repro import write_repro
from infer_ref.conformance.engines.verdicts.thresholds import thresholds_for


def judge_agreement(model_dir: Path, tier: EngineTier, handle: EngineHandle, test: str, requests: list[EngineRequest],
                    outputs: list[EngineOutput], kind: str, run_label: str = "",
                    sent_before: Sequence[EngineRequest] = ()) -> None:  # fmt: skip
    """float32/float64: every position within the oracle tolerance. bfloat16/float16: the
    distribution of the ``kind`` positions within the calibrated thresholds (``run_label`` tells
    the report's rows of one test's runs apart: "cold", "warm"). ``sent_before``: requests the
    engine ran first whose cached state ``requests`` meet (a conversation's first turns): a repro
    sends them first too."""
    per_request = [judged_positions(model_dir, i, r, o) for i, (r, o) in enumerate(zip(requests, outputs, strict=True))]
    if tier.dtype in LOW_PRECISION:  # each test's own kind of position (thresholds are calibrated per kind)
        per_request = [of_kind(positions, kind) for positions in per_request]
    for positions in per_request:
        tier.distances.record(f"{test}[{model_dir.name}]", max((distance_from_oracle(p.entry, p.row) for p in positions), default=0.0))
    if tier.dtype in LOW_PRECISION:
        failure = _distribution_failure(model_dir, tier, f"{test} ({run_label})" if run_label else test, kind, per_request)
    else:
        failure = _position_failure(per_request, tier.dtype, requests, outputs)
    if failure:
        summary, detail, tol = failure
        every, schedule = [*sent_before, *requests], [list(range(len(sent_before))), list(range(len(sent_before), len(sent_before) + len(requests)))]
        repro = write_repro(handle, test, model_dir, every, [[group for group in schedule if group]], summary + ": " + detail.splitlines()[0], tol,
                            tier.selects(), tier.start_of("stressed"))  # fmt: skip
        raise AssertionError(summary + ":\n" + detail + "\n" + repro)


def _position_failure(per_request: list[list[JudgedPosition]], dtype: str, requests: list[EngineRequest],
                      outputs: list[EngineOutput]) -> tuple[str, str, float] | None:  # fmt: skip
    """Each request judged at the tolerance of its length (float32's grows past 333 positions)."""
    report, tolerances = [], []
    for positions, request, output in zip(per_request, requests, outputs, strict=True):
        tol = agreement_tolerance(dtype, len(request.prompt) + len(output.token_ids))
        found = disagreements(positions, tol)
        if found and positions:
            report.append(f"request {positions[0].request} ({positions[0].prompt_len} prompt tokens, tolerance {tol:.3g}): " + "; ".join(found[:3]))
            tolerances.append(tol)
    if not report:
        return None
    flat = agreement_tolerance(dtype)
    grows = "" if max(tolerances) == flat else f", growing with the request's length to {max(tolerances):.3g}"
    return f"{len(report)} of {len(requests)} requests disagree with the oracle (tolerance {flat:g}{grows})", "\n".join(report), max(tolerances)


def _distribution_failure(model_dir: Path, tier: EngineTier, test: str, kind: str,
                          per_request: list[list[JudgedPosition]]) -> tuple[str, str, float] | None:  # fmt: skip
    stats = [p.stat() for positions in per_request for p in positions]
    if not stats:
        return None
    thresholds = thresholds_for(tier.dtype, kind, model_dir.name)
    summary, exceeded = judge(stats, thresholds.values)
    tier.distributions.append({"test": test, "checkpoint": model_dir.name, "kind": kind, "dtype": tier.dtype, **summary.as_dict(),
                               "exceeded": [e.statistic for e in exceeded], "thresholds": thresholds.values, "source": thresholds.source})  # fmt: skip
    if not exceeded:
        return None
    head = f"the {kind} positions' distribution departs from the oracle's in {tier.dtype} ({summary.positions} positions; {thresholds.source})"
    return head, "\n".join(str(e) for e in exceeded), agreement_tolerance(tier.dtype)


__all__ = ["judge_agreement"]
