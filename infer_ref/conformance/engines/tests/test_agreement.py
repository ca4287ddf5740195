"""Agreement with the oracle: every logprob the engine returns, teacher-forced against transformers
in float64 on the same folder. In float32 every logprob must lie within the dtype's tolerance; in
bfloat16 and float16 the distribution of the engine's distances over all positions (KL, logprob
error, same top token) must lie within thresholds calibrated on correct implementations
(:mod:`~infer_ref.conformance.engines.verdicts.distribution`, docs/low-precision.md).

Prompts cross block boundaries (k*bs - 1, k*bs, k*bs + 1 tokens, then 16 generated tokens across
the next boundary), Gemma's sliding window several times, and share prefixes (hits on the stressed
engine, whose chunked-prefill budget and KV budget are small).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import Started, agreement_of
from infer_ref.conformance.engines.verdicts.judge import judge_agreement
from infer_ref.conformance.engines.workloads.prompts import PROMPT_LOGPROBS, agreement_workload

pytestmark = pytest.mark.ir_oracle("transformers float64")


def _workload(
    model_dir: Path, engines: EngineSession, *, prompt_logprobs: int | None = None
) -> list[EngineRequest]:
    requests = agreement_workload(
        engines.facts(model_dir), ignore_eos=engines.ignore_eos, prompt_logprobs=prompt_logprobs
    )
    return engines.judgeable(model_dir, requests)


def test_generated_logprobs_agree_with_oracle(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Every generated step's chosen and top-k logprobs against the float64 oracle at its position,
    all requests in one batch on the stressed engine (prefix hits, chunked prefill, preemption).

    Guards: *logprobs shifted by one position*, *prefix hit reuses another prompt's block*,
    *preemption resumes from a stale position*."""
    requests = _workload(model_dir, engines)
    agreement_of(
        model_dir, engines, started(model_dir), "test_generated_logprobs_agree_with_oracle", requests
    )


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_prompt_logprobs_agree_with_oracle(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Prompt logprobs at every position against the oracle, the batch run twice so the second
    pass meets a warm prefix cache.

    Guards: *prompt logprobs of cached prefix positions stale or zero*."""
    requests = _workload(model_dir, engines, prompt_logprobs=PROMPT_LOGPROBS)
    handle = started(model_dir)
    case = engines.case("test_prompt_logprobs_agree_with_oracle", model_dir, handle)
    for cache in ("cold", "warm"):
        outputs = run(handle, requests)
        judge_agreement(
            case=case,
            ledger=engines.ledger,
            dtype=engines.settings.dtype,
            requests=requests,
            outputs=outputs,
            kind="prompt",
            run_label=cache,
        )
