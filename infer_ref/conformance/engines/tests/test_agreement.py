"""Agreement with the oracle: every logprob the engine returns, teacher-forced against transformers
in float64 on the same folder, at the engine's dtype tolerance.

Prompts cross block boundaries (k*bs - 1, k*bs, k*bs + 1 tokens, then 16 generated tokens across
the next boundary), Gemma's sliding window several times, and share prefixes (hits on the stressed
engine, whose chunked-prefill budget and KV budget are small).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import Tensor

from infer_ref.conformance.engines.oracle import (
    agreement_tolerance,
    compare_position,
    dedupe,
    distance_from_oracle,
    oracle_logprobs,
)
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.repro import write_repro
from infer_ref.conformance.engines.session import EngineTier, run
from infer_ref.conformance.engines.workload import (
    boundary_prompts,
    greedy_requests,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.ir_oracle("transformers float64")


def _workload(model_dir: Path, tier: EngineTier, *, prompt_logprobs: int | None = None) -> list[EngineRequest]:
    facts = tier.facts(model_dir)
    prompts = boundary_prompts(facts) + shared_prefix_prompts(facts) + list(facts.canonical[:2])
    requests = greedy_requests(prompts, ignore_eos="ignore_eos" in tier.capabilities, prompt_logprobs=prompt_logprobs)
    return tier.judgeable(model_dir, requests)


def _positions(model_dir: Path, request: EngineRequest, output: EngineOutput) -> list[tuple[str, TokenLogprobs, Tensor, bool]]:
    """``(where, the engine's entry, the oracle's row [V], chosen greedily)`` at every position the
    engine reported: each generated step, then each prompt position past the first."""
    oracle = oracle_logprobs(model_dir, (*request.prompt, *output.token_ids))  # [T, V]: row i predicts position i + 1
    out = [(f"step {s}", e, oracle[len(request.prompt) - 1 + s], request.greedy) for s, e in enumerate(output.logprobs)]
    out += [(f"prompt position {p}", e, oracle[p - 1], False) for p, e in enumerate(output.prompt_logprobs or ()) if e is not None]
    return out


def disagreements(positions: list[tuple[str, TokenLogprobs, Tensor, bool]], tol: float) -> list[str]:
    """Every one of ``positions`` (:func:`_positions`) where the engine's logprobs leave the oracle's tolerance."""
    found = [d for where, entry, row, chosen in positions for d in compare_position(where, entry, row, tol, chosen=chosen)]
    return [str(d) for d in dedupe(found)]


def _judge(model_dir: Path, tier: EngineTier, handle: EngineHandle, test: str, requests: list[EngineRequest],
           outputs: list[EngineOutput]) -> None:  # fmt: skip
    tol = agreement_tolerance(tier.dtype)
    report = []
    for i, (request, output) in enumerate(zip(requests, outputs, strict=True)):
        positions = _positions(model_dir, request, output)
        distances = [distance_from_oracle(entry, row) for _, entry, row, _ in positions]
        tier.distances.record(f"{test}[{model_dir.name}]", max(distances, default=0.0))
        found = disagreements(positions, tol)
        if found:
            report.append(f"request {i} ({len(request.prompt)} prompt tokens): " + "; ".join(found[:3]))
    if report:
        summary = f"{len(report)} of {len(requests)} requests disagree with the oracle (tolerance {tol:g})"
        repro = write_repro(handle, test, model_dir, requests, [[list(range(len(requests)))]], summary + ": " + report[0], tol,
                            tier.selects(), tier.start_of("stressed"))  # fmt: skip
        raise AssertionError(summary + ":\n" + "\n".join(report) + "\n" + repro)


def test_generated_logprobs_agree_with_oracle(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Every generated step's chosen and top-k logprobs against the float64 oracle at its position,
    all requests in one batch on the stressed engine (prefix hits, chunked prefill, preemption).

    Guards: *logprobs shifted by one position*, *prefix hit reuses another prompt's block*,
    *preemption resumes from a stale position*."""
    requests = _workload(model_dir, tier)
    handle = started(model_dir)
    outputs = run(handle, requests)
    _judge(model_dir, tier, handle, "test_generated_logprobs_agree_with_oracle", requests, outputs)


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_prompt_logprobs_agree_with_oracle(model_dir: Path, tier: EngineTier, started) -> None:  # type: ignore[no-untyped-def]
    """Prompt logprobs at every position against the oracle, the batch run twice so the second
    pass meets a warm prefix cache.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    requests = _workload(model_dir, tier, prompt_logprobs=5)
    handle = started(model_dir)
    for _ in range(2):
        outputs = run(handle, requests)
        _judge(model_dir, tier, handle, "test_prompt_logprobs_agree_with_oracle", requests, outputs)
