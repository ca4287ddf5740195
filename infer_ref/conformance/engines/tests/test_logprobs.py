"""Logprobs semantics: k honoured, sorted, the chosen token's own logprob, values <= 0, prompt
logprobs aligned with their positions (the first has none)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import Started
from infer_ref.conformance.engines.workloads.prompts import boundary_prompts

pytestmark = pytest.mark.ir_oracle("the API's own promises")


@pytest.mark.ir_engine_requires("top_logprobs")
@pytest.mark.parametrize("k", [1, 5])
def test_top_logprobs_count_order_and_chosen(
    model_dir: Path, engines: EngineSession, started: Started, k: int
) -> None:
    """Per step: k alternatives (k + 1 when the chosen token is not among them), sorted from the most
    likely down, every value <= 0, the chosen token's logprob finite and equal to its entry in the
    list; a greedy choice is the list's first entry or tied with it.

    Guards: *top-k list unsorted or missing the chosen token*."""
    requests = engines.judgeable(
        model_dir, [EngineRequest(p, 8, logprobs=k) for p in boundary_prompts(engines.facts(model_dir))[:4]]
    )
    for i, out in enumerate(run(started(model_dir), requests)):
        for step, entry in enumerate(out.logprobs):
            where = f"request {i} step {step}"
            values = [lp for _, lp in entry.top]
            ids = [t for t, _ in entry.top]
            assert len(ids) == len(set(ids)), f"{where}: a token listed twice: {entry.top}"
            assert len(values) in (k, k + 1), f"{where}: {len(values)} alternatives for logprobs={k}"
            head = values[:k]
            assert head == sorted(head, reverse=True), f"{where}: top-{k} not sorted: {entry.top}"
            assert (
                all(v <= 1e-6 for v in values) and math.isfinite(entry.logprob) and entry.logprob <= 1e-6
            ), f"{where}: {entry}"
            assert entry.token == out.token_ids[step], (
                f"{where}: logprobs of token {entry.token}, generated {out.token_ids[step]}"
            )
            listed = dict(entry.top)
            if entry.token in listed:
                assert abs(listed[entry.token] - entry.logprob) <= 1e-6, (
                    f"{where}: chosen token's logprob differs from its entry"
                )
            assert entry.token in listed or entry.logprob < head[-1] + 1e-6, (
                f"{where}: chosen token {entry.token} ({entry.logprob:.4f}) scores into the top-{k} but is "
                f"missing from it: {entry.top}"
            )
            assert entry.logprob >= head[0] - 1e-3, (
                f"{where}: greedy chose {entry.token} ({entry.logprob:.4f}) below the top entry "
                f"{entry.top[0]}"
            )


@pytest.mark.ir_engine_requires("prompt_logprobs")
def test_prompt_logprobs_aligned(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """One entry per prompt position: None at position 0, then entry i is prompt token i's. The
    prompts run on a cold prefix cache where the engine can empty it (earlier tests ran them: what a
    hit does to prompt logprobs is judged by the warm pass of ``test_prompt_logprobs_agree_with_oracle``,
    and without the reset this verdict would depend on which tests ran before).

    Guards: *logprobs shifted by one position*."""
    requests = engines.judgeable(
        model_dir,
        [EngineRequest(p, 2, prompt_logprobs=3) for p in boundary_prompts(engines.facts(model_dir))[:3]],
    )
    prompts = [r.prompt for r in requests]
    handle = started(model_dir)
    if "reset_prefix_cache" in engines.capabilities:
        handle.reset_prefix_cache()
    outputs = run(handle, requests)
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        lp = out.prompt_logprobs
        assert lp is not None and len(lp) == len(prompt), (
            f"request {i}: {None if lp is None else len(lp)} entries for {len(prompt)} prompt tokens"
        )
        assert lp[0] is None, f"request {i}: position 0 has logprobs {lp[0]} (nothing precedes it)"
        wrong = [(p, e.token, prompt[p]) for p, e in enumerate(lp) if e is not None and e.token != prompt[p]]
        assert not wrong, f"request {i}: (position, token given, prompt token) {wrong[:4]}"
