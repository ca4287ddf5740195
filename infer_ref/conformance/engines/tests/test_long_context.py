"""The long-context workload (``--ir-long-context``): engines judged at the lengths and shapes they
serve, on the kit's long checkpoints (released Gemma 3 layouts with windows of 512 and 1024, Llama
3.2's RoPE scaling around 8192, Qwen 3) or the folders given.

Prompts cross every window of the folder once and twice, Llama 3's ``original_max_position_embeddings``,
and 8192 positions (block tables of 257 blocks of 32, 8193 blocks of 1); the stressed engine prefills
them in chunks of 1000 tokens across those boundaries, serves continued conversations from its prefix
cache with the cached part past the window, and holds a pool that two whole-block prompts fill exactly
(:mod:`~infer_ref.conformance.engines.workloads.long`). Agreement is judged against the float64 oracle
as in the default workload, self-consistency against each request alone on the plain engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.session import EngineSession, run
from infer_ref.conformance.engines.tests.scenarios import (
    Started,
    agreement_of,
    batch_against_alone,
    conversation_against_oracle,
    conversation_warm_against_cold,
    each_in_chunks_against_alone,
)
from infer_ref.conformance.engines.verdicts.judge import judge_prefix_hits
from infer_ref.conformance.engines.verdicts.prefix_hits import CountedPair
from infer_ref.conformance.engines.workloads.long import (
    BLOCK_SIZES,
    LONG_CHUNK_BUDGET,
    POOL_BLOCKS,
    continued_long_turns,
    first_long_turns,
    long_requests,
    pool_edge_prompts,
)
from infer_ref.conformance.engines.workloads.prompts import greedy_requests
from infer_ref.conformance.engines.workloads.text_stable import common_prefix

pytestmark = pytest.mark.ir_long_context


def _long(model_dir: Path, engines: EngineSession) -> list[EngineRequest]:
    """The long prompts (drawn once the engine has started: a test whose engine cannot start draws
    nothing)."""
    facts = engines.facts(model_dir)
    return engines.judgeable(model_dir, long_requests(facts, model_dir, ignore_eos=engines.ignore_eos))


@pytest.mark.ir_oracle("transformers float64")
def test_long_prompts_agree_with_oracle(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Every generated step of each long prompt against the float64 oracle, all in one batch on the
    stressed engine (chunked prefill across the windows, a pool the batch overflows: preemption of
    requests thousands of positions long).

    Guards: *window off-by-one*, *llama3 rope scaling ignored*, *preemption resumes from a stale position*,
    *block table entries truncated to a narrow integer*, *RoPE positions past a precomputed table clamped*."""
    agreement_of(
        model_dir,
        engines,
        started(model_dir),
        "test_long_prompts_agree_with_oracle",
        _long(model_dir, engines),
    )


@pytest.mark.ir_oracle("self-consistency")
def test_long_batch_matches_alone(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """The long prompts in one batch on the stressed engine answer as each alone on the plain one.

    Guards: *batch row reads a neighbour's cache*, *preemption resumes from a stale position*."""
    batch_against_alone(
        model_dir, engines, started(model_dir), "test_long_batch_matches_alone", _long(model_dir, engines)
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("chunked_prefill")
def test_long_chunked_prefill_matches_whole(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Each long prompt alone on the stressed engine (prefilled in chunks whose edges fall inside
    windows and blocks) answers as on the plain engine (prefilled whole).

    Guards: *prompt chunk positions restart at 0*, *prompt chunk sees the cache past its sliding window*,
    *prompt chunk K/V not written*."""
    each_in_chunks_against_alone(
        model_dir,
        engines,
        started(model_dir),
        "test_long_chunked_prefill_matches_whole",
        _long(model_dir, engines),
        f"prefilled in chunks of {LONG_CHUNK_BUDGET} tokens",
        cold=True,
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("kv_budget", "batch")
def test_pool_exhausted_at_block_boundary(model_dir: Path, engines: EngineSession, started: Started) -> None:
    """Two prompts of whole blocks that fill the stressed engine's pool exactly: the first token
    either generates needs a block the pool does not have, at a block boundary. The engine preempts
    (or waits), never crashes, and both answer as alone.

    Guards: *preemption resumes from a stale position*."""
    handle = started(model_dir)
    facts = engines.facts(model_dir)
    requests = engines.judgeable(
        model_dir, greedy_requests(pool_edge_prompts(facts), ignore_eos=engines.ignore_eos)
    )
    batch_against_alone(
        model_dir,
        engines,
        handle,
        "test_pool_exhausted_at_block_boundary",
        requests,
        what=f"two prompts filling the pool of {POOL_BLOCKS} blocks exactly",
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("block_size")
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_block_size_matches(
    model_dir: Path, engines: EngineSession, started: Started, block_size: int
) -> None:
    """The long prompts and the pool-edge pair in one batch on the stressed engine started with KV
    blocks of ``block_size`` positions (1: every position a block boundary and tables of 8193
    blocks) answer as each alone on the plain engine (blocks of 32). An engine without that size
    refuses the start: "not supported".

    Guards: *decode slot off by one in the block table*, *prefix hit reuses another prompt's block*."""
    kind = f"block-{block_size}"
    handle = started(model_dir, kind)
    facts = engines.facts(model_dir)
    ignore_eos = engines.ignore_eos
    requests = engines.judgeable(
        model_dir,
        long_requests(facts, model_dir, ignore_eos=ignore_eos)
        + greedy_requests(pool_edge_prompts(facts), ignore_eos=ignore_eos),
    )
    batch_against_alone(
        model_dir,
        engines,
        handle,
        "test_block_size_matches",
        requests,
        kind=kind,
        what=f"batched with KV blocks of {block_size}",
    )


@pytest.mark.ir_oracle("transformers float64")
def test_long_continued_conversation_agrees_with_oracle(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Conversations whose first turn crossed the window (and 8192 positions), continued on the
    stressed engine: the cached part is longer than the window. Every step against the oracle.

    Guards: *causal mask top-left aligned for T>1 over a cache*, *prefix hit reuses another prompt's
    block*."""
    conversation_against_oracle(
        model_dir, engines, started(model_dir), "test_long_continued_conversation_agrees_with_oracle"
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache", "cached_tokens")
def test_long_prefix_cache_serves_the_cached_turn(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """Each long first turn, then its continuation, on a cache emptied before each pair: the engine
    says it served the first turn's prompt and answer from cache, every whole block of them (past
    the window, past 256 blocks) at the granularity its own hits show. No hit at all: "not judged".

    Guards: *prefix cache stops hitting past the first block*."""
    handle = started(model_dir)
    facts, ignore_eos = engines.facts(model_dir), engines.ignore_eos
    pairs = []
    for first in engines.judgeable(model_dir, first_long_turns(facts, model_dir, ignore_eos=ignore_eos)):
        handle.reset_prefix_cache()
        [answer] = run(handle, [first])
        left_out: list[str] = []
        continued = continued_long_turns(facts, [first], [answer], ignore_eos=ignore_eos, left_out=left_out)
        engines.not_continued(model_dir, left_out)
        for request in (r for r in continued if engines.readable(model_dir, r)):  # probed on another engine
            [served] = run(handle, [request])
            shared = common_prefix(first.prompt + answer.token_ids, request.prompt)
            pairs.append(CountedPair(shared, answer.cached_tokens, served.cached_tokens))
    judge_prefix_hits(
        ledger=engines.ledger,
        engine=engines.name,
        pairs=pairs,
        requests="continued conversations",
        computed="the conversation",
    )


@pytest.mark.ir_oracle("self-consistency")
@pytest.mark.ir_engine_requires("prefix_caching", "reset_prefix_cache")
def test_long_continued_conversation_matches_cold(
    model_dir: Path, engines: EngineSession, started: Started
) -> None:
    """The long continuations served warm answer as the same requests on an emptied prefix cache.

    Guards: *prefix hit reuses another prompt's block*."""
    conversation_warm_against_cold(
        model_dir, engines, started(model_dir), "test_long_continued_conversation_matches_cold"
    )
