"""Determinism: a seeded sampled request gives the same tokens every time, alone or in any batch,
preempted or not, whatever the order the requests arrive in.

In bfloat16 and float16 a batch or a recompute changes a step's logits by rounding, and the same
seeded draw may then choose another token: there the tokens are compared up to the first step whose
reported distribution differs between the runs
(:func:`~infer_ref.conformance.engines.verdicts.compare.seeded_tokens_differ`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import Started
from infer_ref.conformance.engines.verdicts.compare import seeded_tokens_differ
from infer_ref.conformance.engines.workloads.prompts import boundary_prompts

pytestmark = [pytest.mark.ir_oracle("self-consistency"), pytest.mark.ir_engine_requires("seed")]


def _sampled(prompt: tuple[int, ...], seed: int, max_tokens: int = 12) -> EngineRequest:
    return EngineRequest(prompt, max_tokens, temperature=1.0, seed=seed, logprobs=1)


# Tokens per request of the preemption test: enough decode growth that running requests still need
# blocks once every prompt is in. With chunked prefill the prompts enter a few per step and a
# preemption takes the request being prefilled first (admitted last); at 12 tokens no decoding
# request was preempted on infer_ref's Engine, at 24 one is (llama-tiny).
PREEMPTING_TOKENS = 24


def test_seeded_request_repeats(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """The same seeded request twice alone: the same tokens.

    Guards: *seeded sampling not reproducible*."""
    [request] = engines.judgeable(model_dir, [_sampled(boundary_prompts(engines.facts(model_dir))[0], 1234)])
    handle = started(model_dir)
    first, second = (run(handle, [request])[0] for _ in range(2))
    assert first.token_ids == second.token_ids, f"seed 1234 gave {first.token_ids} then {second.token_ids}"


@pytest.mark.ir_engine_requires("batch")
def test_seeded_request_same_in_batch(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """A seeded request alone and as each row of a batch of differently seeded neighbours: the
    same tokens, whichever row it sits in.

    Guards: *batch row samples with its neighbour's seed*."""
    prompts = boundary_prompts(engines.facts(model_dir))[:4]
    handle = started(model_dir)
    target, *others = engines.judgeable(
        model_dir, [_sampled(prompts[0], 77)] + [_sampled(p, 1000 + i) for i, p in enumerate(prompts[1:])]
    )
    [alone] = run(handle, [target])
    for row in range(len(others) + 1):
        batch = [*others[:row], target, *others[row:]]
        got = run(handle, batch)[row]
        why = seeded_tokens_differ(alone, got, exact=not engines.settings.low_precision)
        assert why is None, f"row {row} of a batch of {len(batch)}: {why}"


@pytest.mark.ir_engine_requires("batch", "kv_budget")
def test_seeded_requests_same_under_preemption_and_arrival_order(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Every boundary prompt, each with its own seed, sent together to the stressed engine (its KV
    budget holds a few of them at once, so decode steps preempt), then again in reverse order:
    each request's tokens are those it gives alone on the plain engine.

    Guards: *seeded tokens change when the request is preempted*, *seeded tokens depend on preemption or the
    batch*."""
    prompts = boundary_prompts(engines.facts(model_dir))
    requests = engines.judgeable(
        model_dir, [_sampled(p, 500 + i, PREEMPTING_TOKENS) for i, p in enumerate(prompts)]
    )
    alone = [engines.alone(model_dir, r) for r in requests]
    handle = started(model_dir, "stressed")
    for name, order in (
        ("arrival", list(range(len(requests)))),
        ("reverse", list(range(len(requests)))[::-1]),
    ):
        got = run(handle, [requests[i] for i in order])
        for i, out in zip(order, got, strict=True):
            why = seeded_tokens_differ(alone[i], out, exact=not engines.settings.low_precision)
            assert why is None, f"request {i} ({name} order, preempting budget): {why}"
