"""A conversation continued — the request a chat server sees most: the previous prompt, the
engine's own answer to it and a new turn, sent after the first turn so that a prefix-caching
engine serves the prompt and the answer from cache (for Gemma 3, a cached part longer than the
sliding window: every first turn but the shortest crosses gemma3-tiny's window of 8).

Judged against the oracle (agreement, as the agreement tests judge) and against the same requests
on a cold cache (self-consistency).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.session import EngineSession
from infer_ref.conformance.engines.tests.scenarios import (
    Started,
    conversation_against_oracle,
    conversation_warm_against_cold,
)


@pytest.mark.ir_oracle("transformers float64")
def test_continued_conversation_agrees_with_oracle(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Every step of each continued conversation against the oracle, on the stressed engine
    (its prompt and answer cached, chunked prefill, a small KV budget).

    Guards: *prefix hit reuses another prompt's block*, *causal mask top-left aligned for T>1 over a
    cache*."""
    conversation_against_oracle(
        model_dir, engines, started(model_dir), "test_continued_conversation_agrees_with_oracle"
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_continued_conversation_matches_cold(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """The continuations served warm (the first turns cached) answer as the same requests sent
    again on an emptied prefix cache.

    Guards: *prefix hit reuses another prompt's block*."""
    conversation_warm_against_cold(
        model_dir, engines, started(model_dir), "test_continued_conversation_matches_cold"
    )
