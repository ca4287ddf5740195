"""The long-context workload (``--long-context``): prompts to 8193 positions that cross the folder's
own boundaries, and the engine geometry that makes them cross a scheduler's and a pool's too.

Lengths come from the checkpoint folder's config.json, so the same workload fits any folder given
with ``--model-dir``: each sliding window W (W - 1, W, W + 1 and 2W + 1 positions: the window's edge
reached, crossed once and twice), Llama 3's ``original_max_position_embeddings`` R (R - 1 and R + 1:
the generated steps cross it), and :data:`REACH` (8191 and 8193: a block table of 256 blocks of 32,
then one more). The windows and R are multiples of the block size, so every one of those lengths
also sits at a block boundary.

The stressed engine prefills in chunks of :data:`LONG_CHUNK_BUDGET` tokens (a budget that divides no
window and no block: chunk edges fall inside windows and blocks) and holds :data:`POOL_BLOCKS` blocks:
exactly the pool-edge pair's prompts (:func:`pool_edge_prompts`), so when both have prefilled, the
next token of each needs a block the pool does not have — at a block boundary.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.workloads.prompts import (
    BLOCK_SIZE,
    ModelFacts,
    continued_turns,
    greedy_requests,
    random_prompt,
)

REACH = 8192  # the longest prompts reach one past it
LONG_GENERATED = 16  # generated tokens per request (from R - 1, they cross R)
LONG_CHUNK_BUDGET = 1000  # tokens per step on the stressed engine: no window or block divides it
LONG_NEW_TURN = 9  # a continued conversation's new turn
# The pool-edge pair: prompts of whole blocks whose sum is the stressed engine's pool.
POOL_EDGE_BLOCKS = (REACH // BLOCK_SIZE, 1024 // BLOCK_SIZE)  # 256 + 32 blocks: 8192 and 1024 prompt tokens
POOL_BLOCKS = sum(POOL_EDGE_BLOCKS)
# The longest request: a continued conversation of the longest prompt (REACH + 1 + 16 + 9 + 16).
LONG_MAX_MODEL_LEN = REACH + 256
PLAIN_LONG_KV_TOKENS = 2 * LONG_MAX_MODEL_LEN  # ample: the plain engine runs one request at a time
BLOCK_SIZES = (1, 16)  # besides the tier's 32: every position a block boundary; a table of 513 blocks


def window_sizes(model_dir: Path) -> list[int]:
    """The sliding windows config.json sets (none for a model of global layers only)."""
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") == "qwen3" and not config.get("use_sliding_window", False):
        return []
    window = config.get("sliding_window")
    return [int(window)] if window else []


def rope_threshold(model_dir: Path) -> int | None:
    """Llama 3 RoPE scaling's ``original_max_position_embeddings`` (either config style), else None."""
    config = json.loads((model_dir / "config.json").read_text())
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if "full_attention" in params:  # t5 Gemma: per layer type
        params = params["full_attention"]
    value = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
    return int(value) if value else None


def long_lengths(model_dir: Path) -> list[int]:
    """The prompt lengths of the long workload for ``model_dir``, ascending, each once."""
    lengths = {REACH - 1, REACH + 1}
    for w in window_sizes(model_dir):
        lengths |= {w - 1, w, w + 1, 2 * w + 1}
    if (r := rope_threshold(model_dir)) is not None:
        lengths |= {r - 1, r + 1}
    return sorted(n for n in lengths if 0 < n <= REACH + 1)


def long_prompts(facts: ModelFacts, model_dir: Path, seed: int = 0) -> list[tuple[int, ...]]:
    """One prompt of each of :func:`long_lengths`."""
    return _drawn(facts, f"long/{seed}", long_lengths(model_dir))


def _drawn(facts: ModelFacts, stream: str, lengths: list[int]) -> list[tuple[int, ...]]:
    """Prompts of ``lengths`` from the seeded ``stream``, drawn once per process: every test of the
    workload sends the same ones, and text-stable ones of 8193 tokens take about a second to draw."""
    key = (
        facts,
        facts.text.digest if facts.text else None,
        stream,
        tuple(lengths),
    )  # folders of one name may differ
    if key not in _DRAWN:
        rng = random.Random(f"{facts.name}/{stream}")
        _DRAWN[key] = [random_prompt(facts, n, rng) for n in lengths]
    return list(_DRAWN[key])


_DRAWN: dict[tuple[ModelFacts, str | None, str, tuple[int, ...]], list[tuple[int, ...]]] = {}


def long_requests(
    facts: ModelFacts, model_dir: Path, *, ignore_eos: bool, seed: int = 0
) -> list[EngineRequest]:
    return greedy_requests(
        long_prompts(facts, model_dir, seed), ignore_eos=ignore_eos, max_tokens=LONG_GENERATED
    )


def first_long_turns(facts: ModelFacts, model_dir: Path, *, ignore_eos: bool) -> list[EngineRequest]:
    """A conversation's first turns: one just past the first window (or R), one past :data:`REACH`.
    Continued, the cached part is longer than the window."""
    lengths = long_lengths(model_dir)
    past_window = [n for n in lengths if any(n == w + 1 for w in window_sizes(model_dir))]
    chosen = sorted({(past_window or lengths[:1])[0], lengths[-1]})
    return greedy_requests(
        _drawn(facts, "long-turns", chosen), ignore_eos=ignore_eos, max_tokens=LONG_GENERATED
    )


def continued_long_turns(
    facts: ModelFacts,
    first: list[EngineRequest],
    answers: list[EngineOutput],
    *,
    ignore_eos: bool,
    left_out: list[str] | None = None,
) -> list[EngineRequest]:
    """:func:`~infer_ref.conformance.engines.workloads.prompts.continued_turns` at this workload's
    lengths: new turns of :data:`LONG_NEW_TURN` tokens, :data:`LONG_GENERATED` generated."""
    return continued_turns(
        facts,
        first,
        answers,
        ignore_eos=ignore_eos,
        left_out=left_out,
        max_tokens=LONG_GENERATED,
        new_turn=LONG_NEW_TURN,
        stream="long-continued",
    )


def pool_edge_prompts(facts: ModelFacts) -> list[tuple[int, ...]]:
    """Two prompts of exactly :data:`POOL_EDGE_BLOCKS` blocks: together they fill the stressed pool,
    and the first generated token of either needs one block more."""
    return _drawn(facts, "pool-edge", [blocks * BLOCK_SIZE for blocks in POOL_EDGE_BLOCKS])


__all__ = [
    "BLOCK_SIZES",
    "LONG_CHUNK_BUDGET",
    "LONG_GENERATED",
    "LONG_MAX_MODEL_LEN",
    "PLAIN_LONG_KV_TOKENS",
    "POOL_BLOCKS",
    "POOL_EDGE_BLOCKS",
    "REACH",
    "continued_long_turns",
    "first_long_turns",
    "long_lengths",
    "long_prompts",
    "long_requests",
    "pool_edge_prompts",
    "window_sizes",
]
