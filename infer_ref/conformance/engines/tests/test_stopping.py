"""Stopping: max_tokens exact, EOS ids from config.json and generation_config.json, stop strings cut
at their earliest occurrence (also across token boundaries), finish reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import Started
from infer_ref.conformance.engines.workloads.prompts import boundary_prompts, stop_string_in
from infer_ref.conformance.interface.contract import Unsupported

pytestmark = pytest.mark.ir_oracle("the request's own limits")


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_exact(model_dir: Path, engines: EngineSession, started: Started, max_tokens: int) -> None:
    """``max_tokens`` tokens exactly with finish "length", unless an EOS came first (then it is the
    last token and finish is "stop").

    Guards: *max_tokens off by one*."""
    facts = engines.facts(model_dir)
    ignore = engines.ignore_eos
    requests = engines.judgeable(
        model_dir,
        [EngineRequest(p, max_tokens, ignore_eos=ignore, logprobs=1) for p in boundary_prompts(facts)],
    )
    for i, out in enumerate(run(started(model_dir), requests)):
        ended_by_eos = not ignore and out.token_ids[-1:] and out.token_ids[-1] in facts.eos_ids
        if ended_by_eos:
            assert len(out.token_ids) <= max_tokens and out.finish_reason == "stop", f"request {i}: {out}"
        else:
            assert len(out.token_ids) == max_tokens, (
                f"request {i}: {len(out.token_ids)} tokens for max_tokens={max_tokens}"
            )
            assert out.finish_reason == "length", (
                f"request {i}: finish {out.finish_reason!r} at the length limit"
            )
        assert len(out.logprobs) == len(out.token_ids), (
            f"request {i}: {len(out.logprobs)} logprob entries for {len(out.token_ids)} tokens"
        )


def test_eos_ends_generation(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """An EOS id (any of config.json's and generation_config.json's) ends a greedy request, as the
    last token, with finish "stop"; no EOS id appears before the end. Refuses to pass unless some
    request met an EOS (the fixtures' canonical prompts are answered up to one).

    Guards: *EOS ignored or only partly honoured*."""
    facts = engines.facts(model_dir)
    if not facts.canonical:
        pytest.skip(f"{facts.name} has no canonical prompts answered up to an EOS (only the fixtures do)")
    requests = engines.judgeable(model_dir, [EngineRequest(p, 64, logprobs=1) for p in facts.canonical])
    outputs = run(started(model_dir), requests)
    met = 0
    for i, out in enumerate(outputs):
        early = [t for t in out.token_ids[:-1] if t in facts.eos_ids]
        assert not early, (
            f"request {i}: EOS id(s) {early} inside the output; generation should have ended there"
        )
        if out.token_ids and out.token_ids[-1] in facts.eos_ids:
            met += 1
            assert out.finish_reason == "stop", (
                f"request {i}: ended at EOS {out.token_ids[-1]} with finish {out.finish_reason!r}"
            )
    unread = len(facts.canonical) - len(requests)
    if not met and unread:  # the answers that could show an EOS are the ones the engine's API hides
        raise Unsupported(
            f"no request ended at an EOS id among those whose answers {engines.name} shows as ids; "
            f"{unread} of {len(facts.canonical)} were left out as unreadable (see the report's notes)"
        )
    assert met, (
        f"no request ended at an EOS id {sorted(facts.eos_ids)}: the engine ignores them or the answers "
        "changed"
    )


@pytest.mark.ir_engine_requires("stop_strings")
def test_stop_string_cut_at_earliest(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """A stop string taken from a request's own text (occurring at least twice, valid text) ends it at
    its first occurrence: the text is everything before it and finish is "stop".

    Guards: *stop string cut at the last occurrence*."""
    facts = engines.facts(model_dir)
    handle = started(model_dir)
    requests = engines.judgeable(
        model_dir, [EngineRequest(p, 32, logprobs=1) for p in list(facts.canonical) + boundary_prompts(facts)]
    )
    prompts = [r.prompt for r in requests]

    # Each request alone on a cold prefix cache, as the stopped one is sent: in bfloat16 a batch, or
    # a prompt served from cache, rounds differently from a request computed alone, and the greedy
    # text of the two schedules may part (a schedule is not what this test judges).
    def cold_alone(request: EngineRequest) -> EngineOutput:
        if "reset_prefix_cache" in engines.capabilities:
            handle.reset_prefix_cache()
        return run(handle, [request])[0]

    free = [cold_alone(r) for r in requests]
    judged = 0
    for prompt, out in zip(prompts, free, strict=True):
        stop = stop_string_in(out.text)
        if stop is None:
            continue
        cut = cold_alone(EngineRequest(prompt, 32, stop=(stop,), logprobs=1))
        expected = out.text[: out.text.find(stop)]
        assert cut.text == expected, (
            f"stop {stop!r}: text {cut.text!r}, expected {expected!r} (cut at its first occurrence)"
        )
        assert cut.finish_reason == "stop", f"stop {stop!r} reached but finish {cut.finish_reason!r}"
        judged += 1
    if not judged:
        pytest.skip("no generated text repeated a piece of 2-3 characters to use as a stop string")
