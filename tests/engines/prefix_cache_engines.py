"""Engines whose prefix caches are correct but hit unusually (``--ir-engine prefix_cache_engines:NAME``
with this folder on the path): the tier must judge them, or say it could not, never fail them."""

from __future__ import annotations

from pathlib import Path

from infer_ref.conformance.engines.adapters.infer_ref_engine import CAPABILITIES, InferRefEngine
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.engine.block_manager import BlockManager, TokenSequence


class NoHits(BlockManager):
    """Prefix caching on, but no lookup ever matches (a cache whose blocks outgrow every prompt)."""

    def _max_hit_blocks(self, num_tokens: int) -> int:
        return 0


class ExtendingOnly(BlockManager):
    """Reuses a prefix only when the new prompt goes past it: a prompt identical to one allocated
    before is computed afresh (as some servers do, keeping an exact repeat out of the cache)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.allocated: set[tuple[int, ...]] = set()

    def _lookup_hits(self, seq: TokenSequence) -> tuple[list[int], list[int], int]:
        if tuple(seq.token_ids) in self.allocated:
            return [], [], self._max_hit_blocks(len(seq.token_ids))
        return super()._lookup_hits(seq)

    def allocate(self, seq: TokenSequence) -> None:
        super().allocate(seq)
        self.allocated.add(tuple(seq.token_ids))


def _engine_with(manager: type[BlockManager]):  # type: ignore[no-untyped-def]
    def start(model_dir: Path, options: EngineOptions) -> InferRefEngine:
        engine = InferRefEngine(Path(model_dir), options)
        blocks = engine.engine.blocks
        engine.engine.blocks = manager(blocks.pool, enable_prefix_caching=blocks.enable_prefix_caching)
        return engine

    start.capabilities = CAPABILITIES  # type: ignore[attr-defined]
    return start


no_hits = _engine_with(NoHits)
extending_only = _engine_with(ExtendingOnly)
