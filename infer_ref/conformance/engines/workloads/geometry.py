"""The geometry of a workload's engine starts: how long a request may be, how large the KV caches
are and how many tokens a scheduler step takes, and the options of each kind of start.

Per checkpoint the tier starts an engine at most twice (four times on the long-context workload):

* **plain**: prefix caching off, the whole prompt prefilled at once, an ample KV cache. Each request
  run *alone* on it gives the reference answers of the self-consistency properties.
* **stressed**: prefix caching on, a chunked-prefill budget of ``CHUNK_BUDGET`` tokens, and a KV
  budget of ``KV_BUDGET_BLOCKS`` blocks (smaller than a full batch needs, so a batch preempts),
  wherever the engine declares the capability. The agreement properties run on it.

The long-context workload (:mod:`~infer_ref.conformance.engines.workloads.long`) starts the same two
kinds at its own lengths (a chunk budget of 1000 tokens, a pool exactly as large as its pool-edge
pair), and ``block-1`` / ``block-16``: the stressed engine with KV blocks of 1 and 16 positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.engines.workloads.long import (
    LONG_CHUNK_BUDGET,
    LONG_MAX_MODEL_LEN,
    PLAIN_LONG_KV_TOKENS,
    POOL_BLOCKS,
)
from infer_ref.conformance.engines.workloads.prompts import BLOCK_SIZE

CHUNK_BUDGET = 64  # tokens per scheduler step: prompts of 65+ tokens prefill in chunks
KV_BUDGET_BLOCKS = 10  # fits the longest request (97 + 16 tokens: 4 blocks), not a batch of them
PLAIN_KV_TOKENS = 64 * BLOCK_SIZE
MAX_MODEL_LEN = 256  # the longest request is 97 + 16 tokens; a KV budget must hold one whole (vLLM checks)


@dataclass(frozen=True)
class Geometry:
    """The sizes a workload's starts use: the same rules (:func:`options_for`), other lengths."""

    max_model_len: int  # the longest request, prompt and generation
    plain_kv_tokens: int  # the plain start's ample KV cache
    chunk_budget: int  # the stressed start's tokens per step
    stressed_kv_tokens: int  # the stressed start's KV budget (the same tokens at every block size)


DEFAULT_GEOMETRY = Geometry(MAX_MODEL_LEN, PLAIN_KV_TOKENS, CHUNK_BUDGET, KV_BUDGET_BLOCKS * BLOCK_SIZE)
# Its pool is exactly the pool-edge pair's blocks: exhausted at a block boundary, at every block size.
LONG_GEOMETRY = Geometry(
    LONG_MAX_MODEL_LEN, PLAIN_LONG_KV_TOKENS, LONG_CHUNK_BUDGET, POOL_BLOCKS * BLOCK_SIZE
)


def geometry_of(long_context: bool) -> Geometry:
    """The long-context workload's geometry, or the default one's."""
    return LONG_GEOMETRY if long_context else DEFAULT_GEOMETRY


def options_for(
    kind: str, dtype: str, capabilities: frozenset[str], *, long_context: bool = False
) -> EngineOptions:
    """The options of a ``plain``, ``stressed`` (``probe``: a separate start of the same options) or
    ``block-N`` (the stressed start with KV blocks of N positions) start at the workload's geometry,
    limited to what the engine can honour."""
    geometry = geometry_of(long_context)
    plain = EngineOptions(
        dtype=dtype,
        prefix_caching=False,
        block_size=BLOCK_SIZE,
        kv_cache_tokens=geometry.plain_kv_tokens,
        max_model_len=geometry.max_model_len,
    )
    if kind == "plain":
        return plain
    return replace(
        plain,
        prefix_caching="prefix_caching" in capabilities,
        block_size=int(kind.removeprefix("block-")) if kind.startswith("block-") else BLOCK_SIZE,
        max_num_batched_tokens=geometry.chunk_budget if "chunked_prefill" in capabilities else None,
        kv_cache_tokens=geometry.stressed_kv_tokens
        if "kv_budget" in capabilities
        else geometry.plain_kv_tokens,
    )


__all__ = ["DEFAULT_GEOMETRY", "LONG_GEOMETRY", "Geometry", "geometry_of", "options_for"]
