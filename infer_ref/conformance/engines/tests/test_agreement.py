"""Agreement with the oracle: every logprob the engine returns, teacher-forced against transformers
in float64 on the same folder. In float32 every logprob must lie within the dtype's tolerance; in
bfloat16 and float16 the distribution of the engine's distances over all positions (KL, logprob
error, same top token) must lie within thresholds calibrated on correct implementations
(:mod:`~infer_ref.conformance.engines.distribution`, docs/low-precision.md).

Prompts cross block boundaries (k*bs - 1, k*bs, k*bs + 1 tokens, then 16 generated tokens across
the next boundary), Gemma's sliding window several times, and share prefixes (hits on the stressed
engine, whose chunked-prefill budget and KV budget are small).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.agreement import (
    LOW_PRECISION,
    PROMPT_LOGPROBS,
    JudgedPosition,
    agreement_workload,
    disagreements,
    judged_positions,
)
from infer_ref.conformance.engines.distribution import judge
from infer_ref.conformance.engines.oracle import agreement_tolerance, distance_from_oracle
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest
from infer_ref.conformance.engines.repro import write_repro
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.thresholds import thresholds_for

pytestmark = pytest.mark.ir_oracle("transformers float64")


def _workload(model_dir: Path, tier: EngineTier, *, prompt_logprobs: int | None = None) -> list[EngineRequest]:
    requests = agreement_workload(tier.facts(model_dir), ignore_eos="ignore_eos" in tier.capabilities, prompt_logprobs=prompt_logprobs)
    return tier.judgeable(model_dir, requests)


def _judge(model_dir: Path, tier: EngineTier, handle: EngineHandle, test: str, requests: list[EngineRequest],
           outputs: list[EngineOutput], kind: str) -> None:  # fmt: skip
    """float32/float64: every position within the oracle tolerance. bfloat16/float16: the
    distribution of the ``kind`` positions within the calibrated thresholds."""
    per_request = [judged_positions(model_dir, i, r, o) for i, (r, o) in enumerate(zip(requests, outputs, strict=True))]
    if tier.dtype in LOW_PRECISION:  # each test's own kind of position (thresholds are calibrated per kind)
        per_request = [[p for p in positions if p.where.startswith("step" if kind == "generated" else "prompt")] for positions in per_request]
    for positions in per_request:
        tier.distances.record(f"{test}[{model_dir.name}]", max((distance_from_oracle(p.entry, p.row) for p in positions), default=0.0))
    if tier.dtype in LOW_PRECISION:
        failure = _distribution_failure(model_dir, tier, test, kind, per_request)
    else:
        failure = _position_failure(per_request, agreement_tolerance(tier.dtype), len(requests))
    if failure:
        summary, detail, tol = failure
        repro = write_repro(handle, test, model_dir, requests, [[list(range(len(requests)))]], summary + ": " + detail.splitlines()[0], tol,
                            tier.selects(), tier.start_of("stressed"))  # fmt: skip
        raise AssertionError(summary + ":\n" + detail + "\n" + repro)


def _position_failure(per_request: list[list[JudgedPosition]], tol: float, count: int) -> tuple[str, str, float] | None:
    report = []
    for positions in per_request:
        found = disagreements(positions, tol)
        if found and positions:
            report.append(f"request {positions[0].request} ({positions[0].prompt_len} prompt tokens): " + "; ".join(found[:3]))
    if not report:
        return None
    return f"{len(report)} of {count} requests disagree with the oracle (tolerance {tol:g})", "\n".join(report), tol


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


def test_generated_logprobs_agree_with_oracle(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Every generated step's chosen and top-k logprobs against the float64 oracle at its position,
    all requests in one batch on the stressed engine (prefix hits, chunked prefill, preemption).

    Guards: *logprobs shifted by one position*, *prefix hit reuses another prompt's block*,
    *preemption resumes from a stale position*."""
    requests = _workload(model_dir, tier)
    handle = started(model_dir)
    outputs = run(handle, requests)
    _judge(model_dir, tier, handle, "test_generated_logprobs_agree_with_oracle", requests, outputs, "generated")


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_prompt_logprobs_agree_with_oracle(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Prompt logprobs at every position against the oracle, the batch run twice so the second
    pass meets a warm prefix cache.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    requests = _workload(model_dir, tier, prompt_logprobs=PROMPT_LOGPROBS)
    handle = started(model_dir)
    for _ in range(2):
        outputs = run(handle, requests)
        _judge(model_dir, tier, handle, "test_prompt_logprobs_agree_with_oracle", requests, outputs, "prompt")
