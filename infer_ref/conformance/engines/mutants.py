"""Planted bugs in an engine, each a bug class real engines have shipped, for proving the engine
tier catches them (``tests/engines/test_planted_engine_bugs.py``), and the one way the tier plants
a bug in an engine (:class:`PlantedBug`, shared with :mod:`~infer_ref.conformance.engines.kit_bugs`).

Each planted bug is an engine factory (``--engine infer_ref.conformance.engines.mutants:NAME``):
infer_ref's own Engine with one thing broken — either inside it (its block manager or scheduler) or
in what its adapter hands back (the answers rewritten the way a buggy API layer would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.paged import PagedKVCache
from infer_ref.conformance.engines.adapters.infer_ref_engine import CAPABILITIES, InferRefEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.verdicts.tolerances import LOW_PRECISION
from infer_ref.conformance.mutants.engine import (
    CHUNK_BUG_CLASSES,
    ChunkWindowEngine,
    ReseedingEngine,
    RestartingChunkEngine,
    UnwrittenChunkEngine,
)
from infer_ref.conformance.mutants.prefix import UnchainedHash, UnverifiedHit
from infer_ref.engine.block_manager import BlockManager, TokenSequence
from infer_ref.engine.engine import Engine
from infer_ref.engine.scheduler import Scheduler
from infer_ref.engine.sequence import Request

ENGINE_BUG_CLASSES = (
    "logprobs shifted by one position",
    "prompt logprobs of cached prefix positions stale or zero",
    "stop string cut at the last occurrence",
    "max_tokens off by one",
    "batch row samples with its neighbour's seed",
    "prefix hit reuses another prompt's block",
    "top-k list unsorted or missing the chosen token",
    "preemption resumes from a stale position",
    "seeded tokens change when the request is preempted",
    "prefix cache stops hitting past the first block",
    *CHUNK_BUG_CLASSES,
)
# Bugs that are right at small sizes and wrong at released ones: only the long-context workload
# (``--ir-long-context``) reaches them.
LONG_CONTEXT_BUG_CLASSES = (
    "block table entries truncated to a narrow integer",
    "RoPE positions past a precomputed table clamped",
)
# Low-precision recipe errors of no kit mutant (the kit's attention is torch's SDPA, which it does not
# knob): planted in the Engine only (``kit_bugs.py``), judged by the recipe verdict on the numerics
# checkpoints.
RECIPE_BUG_CLASSES = (
    "attention softmax sum accumulated in low precision",
    "residual stream truncated by a fused add + norm",
)


ModelPatch = Callable[[Any], None]  # applied to the loaded model instance: nothing global is touched


class PlantedEngine(InferRefEngine):
    """infer_ref's Engine with a bug planted: every planted engine's base."""

    reproducible = False  # a script of the unbroken Engine would not reproduce the planted bug


PLANTED_DTYPES = ("float32", *LOW_PRECISION)  # the dtypes a planted bug is run in (the power table's columns)


@dataclass(frozen=True)
class PlantedBug:
    """One bug planted in infer_ref's Engine, started as an engine factory (``--engine MODULE:NAME``):
    ``engine``, a :class:`PlantedEngine` that carries it (a broken API layer or part of the Engine),
    with ``model_patch`` applied to the loaded model instance and ``cache_class`` set as the cache
    view each forward sees, where given."""

    name: str
    bug_class: str
    engine: type[InferRefEngine] = PlantedEngine
    model_patch: ModelPatch | None = None
    cache_class: type[PagedKVCache] | None = None
    doc: str = ""
    caught_by: tuple[str, ...] = ()  # the tier's tests expected to fail (test function names)
    checkpoint: str = "llama-tiny"  # the fixture its bug shows on (a window needs Gemma 3)
    long_context: bool = False  # caught by the long-context workload (checkpoint: a long checkpoint's name)
    # The dtypes where the planted change is a bug; elsewhere it is the canonical recipe or a legitimate
    # one (``no_bug_because`` says which), and the power table shows "—" there, neither caught nor missed.
    bug_in: tuple[str, ...] = PLANTED_DTYPES
    no_bug_because: str = ""

    def start(self, model_dir: Path, options: EngineOptions, device: str = "cpu") -> InferRefEngine:
        """The engine with the bug planted (an
        :class:`~infer_ref.conformance.engines.protocol.EngineFactory`)."""
        engine = self.engine(Path(model_dir), options, device=device)
        if self.model_patch is not None:
            self.model_patch(engine.engine.model)
        if self.cache_class is not None:
            engine.engine.cache_class = self.cache_class
        engine.name += f", planted: {self.name}"
        return engine

    def factory(self) -> Callable[..., InferRefEngine]:
        def start(model_dir: Path, options: EngineOptions, device: str = "cpu") -> InferRefEngine:
            return self.start(model_dir, options, device)

        start.capabilities = CAPABILITIES  # type: ignore[attr-defined]
        return start


def planted_factory(module: str, name: str, bugs: Sequence[PlantedBug]) -> Callable[..., InferRefEngine]:
    """``module``'s attribute ``name``: the factory of the planted bug of that name (a module's
    ``__getattr__``, so ``--engine MODULE:NAME`` starts it)."""
    for bug in bugs:
        if bug.name == name:
            return bug.factory()
    raise AttributeError(f"module {module!r} has no planted bug {name!r}")


# -- bugs in what the API layer hands back ------------------------------------------------------


class RewritingEngine(PlantedEngine):
    """infer_ref's Engine whose answers (or requests) pass through a broken API layer."""

    def rewrite_requests(self, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        return list(requests)

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        return output

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        outputs = super().generate(self.rewrite_requests(requests))
        return [self.rewrite_output(r, o) for r, o in zip(requests, outputs, strict=True)]


class ShiftedLogprobs(RewritingEngine):
    """Step i reports step i+1's logprobs (the last step repeats)."""

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        steps = output.logprobs
        return replace(output, logprobs=(*steps[1:], *steps[-1:]))


class ZeroCachedPromptLogprobs(RewritingEngine):
    """Prompt positions served by a prefix hit report logprob 0 (an output buffer never written)."""

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        if not output.prompt_logprobs or not output.cached_tokens:
            return output
        n = output.cached_tokens
        zeroed = tuple(
            e if e is None or i >= n else TokenLogprobs(e.token, 0.0, tuple((t, 0.0) for t, _ in e.top))
            for i, e in enumerate(output.prompt_logprobs)
        )
        return replace(output, prompt_logprobs=zeroed)


class StopAtLastOccurrence(RewritingEngine):
    """Stop strings applied after generation, at their *last* occurrence."""

    def rewrite_requests(self, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        return [replace(r, stop=()) for r in requests]

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        hits = [output.text.rfind(s) for s in request.stop if s in output.text]
        return replace(output, text=output.text[: max(hits)], finish_reason="stop") if hits else output


class OneTokenTooMany(RewritingEngine):
    """The length limit compared with ``>``: max_tokens + 1 tokens."""

    def rewrite_requests(self, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        return [replace(r, max_tokens=r.max_tokens + 1) for r in requests]


class NeighbourSeed(RewritingEngine):
    """In a batch, each seeded row samples with the next row's seed."""

    def rewrite_requests(self, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        if len(requests) < 2:
            return list(requests)
        return [replace(r, seed=requests[(i + 1) % len(requests)].seed) for i, r in enumerate(requests)]


class UnsortedTopK(RewritingEngine):
    """Top-k lists in reverse order."""

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        return replace(output, logprobs=tuple(replace(e, top=e.top[::-1]) for e in output.logprobs))


class ChosenMissingFromTopK(RewritingEngine):
    """The chosen token left out of the top-k list (the list filled up from the next ones)."""

    def rewrite_output(self, request: EngineRequest, output: EngineOutput) -> EngineOutput:
        steps = tuple(replace(e, top=tuple(p for p in e.top if p[0] != e.token)) for e in output.logprobs)
        return replace(output, logprobs=steps)


# -- bugs inside the engine ------------------------------------------------------------------


class StalePositionScheduler(Scheduler):
    """A preempted request loses its newest token's position: readmitted, it recomputes one
    position short and chooses its next token from the stale one's logits."""

    def _preempt(self, request: Request) -> None:
        super()._preempt(request)
        seq: TokenSequence | None = request.seq
        if seq is not None and len(seq.token_ids) > 1:
            seq.token_ids.pop()


class StalePreemption(PlantedEngine):
    def __init__(self, model_dir: Path, options: EngineOptions, *, device: str = "cpu") -> None:
        super().__init__(model_dir, options, device=device)
        self.engine.scheduler_class = StalePositionScheduler


class ReseededAfterPreemption(PlantedEngine):
    """A readmitted request's sampler starts its seeded stream over."""

    engine_class = ReseedingEngine


class UnchainedUnverified(UnchainedHash, UnverifiedHit):
    """Hashes of a block's own tokens, trusted without a look at the block (as engines that do not
    verify a hit do): a block matching another prompt's *second* block is served its K/V."""


class UnchainedPrefixHits(PlantedEngine):
    """Block hashes not chained to their parent, hits not verified: a prompt starting with another
    prompt's second block is served that block's K/V, computed after another first block."""

    def __init__(self, model_dir: Path, options: EngineOptions, *, device: str = "cpu") -> None:
        super().__init__(model_dir, options, device=device)
        blocks = self.engine.blocks
        self.engine.blocks = UnchainedUnverified(
            blocks.pool, enable_prefix_caching=blocks.enable_prefix_caching
        )


class FirstBlockOnly(BlockManager):
    """The lookup never matches past a prompt's first block: every answer stays right, the cache
    just stops paying (a silent performance bug only the cached-token counts show)."""

    def _max_hit_blocks(self, num_tokens: int) -> int:
        return min(1, super()._max_hit_blocks(num_tokens))


class FirstBlockHits(PlantedEngine):
    def __init__(self, model_dir: Path, options: EngineOptions, *, device: str = "cpu") -> None:
        super().__init__(model_dir, options, device=device)
        blocks = self.engine.blocks
        self.engine.blocks = FirstBlockOnly(blocks.pool, enable_prefix_caching=blocks.enable_prefix_caching)


class ChunkPositionsRestart(PlantedEngine):
    engine_class = RestartingChunkEngine


class ChunkWindowFromStart(PlantedEngine):
    engine_class = ChunkWindowEngine


class ChunkKVUnwritten(PlantedEngine):
    engine_class = UnwrittenChunkEngine


# -- bugs only long contexts reach --------------------------------------------------------------

NARROW_BLOCK_ID_BITS = 8  # block ids 256 and up alias 0 and up: a pool or table past 256 blocks
ROPE_TABLE_POSITIONS = 8192  # a cos/sin table of Llama 3's original context, indexed with a clamp


class NarrowBlockIdCache(PagedKVCache):
    """Block tables handed to the kernels as 8-bit ids: block 256 is read and written as block 0."""

    def _device_table(self) -> Tensor:
        table = super()._device_table()  # [B, M] int64, -1 past each row's blocks
        return torch.where(table >= 0, table % (1 << NARROW_BLOCK_ID_BITS), table)


class ClampedRopeTableCache(PagedKVCache):
    """Positions read from a RoPE table of 8192 rows with a clamp: every later position gets row 8191."""

    def positions(self, t: int) -> Tensor:
        return super().positions(t).clamp(max=ROPE_TABLE_POSITIONS - 1)


class NarrowBlockIdEngine(Engine):
    cache_class = NarrowBlockIdCache


class ClampedRopeEngine(Engine):
    cache_class = ClampedRopeTableCache


class NarrowBlockIds(PlantedEngine):
    engine_class = NarrowBlockIdEngine


class ClampedRopeTable(PlantedEngine):
    engine_class = ClampedRopeEngine


ENGINE_MUTANTS = (
    PlantedBug(
        "logprobs_shifted",
        ENGINE_BUG_CLASSES[0],
        ShiftedLogprobs,
        caught_by=("test_generated_logprobs_agree_with_oracle",),
    ),
    PlantedBug(
        "cached_prompt_logprobs_zero",
        ENGINE_BUG_CLASSES[1],
        ZeroCachedPromptLogprobs,
        caught_by=("test_prompt_logprobs_agree_with_oracle",),
    ),
    PlantedBug(
        "stop_at_last_occurrence",
        ENGINE_BUG_CLASSES[2],
        StopAtLastOccurrence,
        caught_by=("test_stop_string_cut_at_earliest",),
    ),
    PlantedBug(
        "max_tokens_plus_one", ENGINE_BUG_CLASSES[3], OneTokenTooMany, caught_by=("test_max_tokens_exact",)
    ),
    PlantedBug(
        "neighbour_seed",
        ENGINE_BUG_CLASSES[4],
        NeighbourSeed,
        caught_by=("test_seeded_request_same_in_batch",),
    ),
    PlantedBug(
        "prefix_hash_unchained",
        ENGINE_BUG_CLASSES[5],
        UnchainedPrefixHits,
        caught_by=("test_generated_logprobs_agree_with_oracle",),
    ),
    PlantedBug(
        "top_k_unsorted",
        ENGINE_BUG_CLASSES[6],
        UnsortedTopK,
        caught_by=("test_top_logprobs_count_order_and_chosen",),
    ),
    PlantedBug(
        "chosen_missing_from_top_k",
        ENGINE_BUG_CLASSES[6],
        ChosenMissingFromTopK,
        caught_by=("test_top_logprobs_count_order_and_chosen",),
    ),
    PlantedBug(
        "preemption_stale_position",
        ENGINE_BUG_CLASSES[7],
        StalePreemption,
        caught_by=("test_generated_logprobs_agree_with_oracle",),
    ),
    PlantedBug(
        "reseeded_after_preemption",
        ENGINE_BUG_CLASSES[8],
        ReseededAfterPreemption,
        caught_by=("test_seeded_requests_same_under_preemption_and_arrival_order",),
    ),
    PlantedBug(
        "prefix_hits_first_block_only",
        ENGINE_BUG_CLASSES[9],
        FirstBlockHits,
        caught_by=("test_prefix_cache_serves_the_shared_prefix",),
    ),
    PlantedBug(
        "chunk_positions_restart",
        ENGINE_BUG_CLASSES[10],
        ChunkPositionsRestart,
        caught_by=("test_chunked_prefill_matches_whole",),
    ),
    PlantedBug(
        "chunk_window_from_chunk_start",
        ENGINE_BUG_CLASSES[11],
        ChunkWindowFromStart,
        caught_by=("test_chunked_prefill_matches_whole",),
        checkpoint="gemma3-tiny",
    ),
    PlantedBug(
        "chunk_kv_unwritten",
        ENGINE_BUG_CLASSES[12],
        ChunkKVUnwritten,
        caught_by=("test_chunked_prefill_matches_whole",),
    ),
)
LONG_CONTEXT_MUTANTS = (
    PlantedBug(
        "block_ids_8_bit",
        LONG_CONTEXT_BUG_CLASSES[0],
        NarrowBlockIds,
        caught_by=("test_long_prompts_agree_with_oracle",),
        checkpoint="qwen3-long",
        long_context=True,
    ),
    PlantedBug(
        "rope_table_clamped_at_8192",
        LONG_CONTEXT_BUG_CLASSES[1],
        ClampedRopeTable,
        caught_by=("test_long_prompts_agree_with_oracle",),
        checkpoint="llama3-long-ropescaling8192",
        long_context=True,
    ),
)


def __getattr__(
    name: str,
) -> Callable[..., InferRefEngine]:  # --engine infer_ref.conformance.engines.mutants:NAME
    return planted_factory(__name__, name, (*ENGINE_MUTANTS, *LONG_CONTEXT_MUTANTS))


__all__ = [
    "ENGINE_BUG_CLASSES",
    "ENGINE_MUTANTS",
    "LONG_CONTEXT_BUG_CLASSES",
    "LONG_CONTEXT_MUTANTS",
    "PlantedBug",
    "PlantedEngine",
    "planted_factory",
]
