"""Planted bugs of the scheduling contract: infer_ref's ``Engine`` with one rule broken, the way
multi-request engines have shipped it. The kit's engine mutants (``mutants/__init__.py``) and the
engine tier's (``engines/mutants.py``) both run these classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.slots import store_rows

from infer_ref.engine.block_manager import BlockManager
from infer_ref.engine.engine import Engine
from infer_ref.engine.scheduler import Scheduler
from infer_ref.engine.sequence import Request

SCHEDULE_BUG_CLASSES = (
    "more sequences running than the batch limit",
    "preempted request requeued behind new arrivals",
    "seeded tokens depend on preemption or the batch",
    "a decode starves behind prompt chunks",
)
# Chunked prefill (``Engine(max_num_batched_tokens=...)``): a prompt chunk is a forward of several
# tokens over positions already in the cache, the case every bug below gets wrong.
CHUNK_BUG_CLASSES = (
    "prompt chunk positions restart at 0",
    "prompt chunk sees the cache past its sliding window",
    "prompt chunk K/V not written",
)


class ChunkOverCacheView(PagedKVCache):
    """A cache view that knows when a forward is several new tokens over computed ones (one row):
    what the planted chunk bugs, and the kit's top-left mask planted in an engine, get wrong."""

    def _is_chunk_over_cache(self, t: int) -> bool:
        """Several new tokens after computed ones, one row: a chunk (or a prefill after a prefix hit)."""
        return t > 1 and self.position.uniform() and self.position.lengths[0] > 0


class RestartingChunkPositions(ChunkOverCacheView):
    """A chunk's positions counted from 0, as if it were the start of the prompt."""

    def positions(self, t: int) -> Tensor:
        if self._is_chunk_over_cache(t):
            return torch.arange(t, device=self.device)
        return super().positions(t)


class ChunkWindowFromChunkStart(ChunkOverCacheView):
    """A chunk's sliding window applied to its own tokens only: every cached key stays visible."""

    def attention_mask(self, t: int, window: int | None) -> Tensor | None:
        mask = super().attention_mask(t, window)
        if mask is None or window is None or not self._is_chunk_over_cache(t):
            return mask
        cached = self.position.lengths[0]
        return mask | (torch.arange(mask.shape[-1], device=self.device) < cached)[None, :]  # [T, S]


class UnwrittenChunkKV(ChunkOverCacheView):
    """A chunk after the first writes no K/V: later tokens read what its blocks held before."""

    def write(self, layer_idx: int, k: Tensor, v: Tensor, *, store: Any = store_rows) -> Any:
        if self._is_chunk_over_cache(k.shape[2]):
            return super().write(layer_idx, k, v, store=lambda *args: None)
        return super().write(layer_idx, k, v, store=store)


class RestartingChunkEngine(Engine):
    cache_class = RestartingChunkPositions


class ChunkWindowEngine(Engine):
    cache_class = ChunkWindowFromChunkStart


class UnwrittenChunkEngine(Engine):
    cache_class = UnwrittenChunkKV


CHUNK_ENGINES: dict[str, tuple[str, type[Engine]]] = {
    "chunk_positions_restart": (CHUNK_BUG_CLASSES[0], RestartingChunkEngine),
    "chunk_window_from_chunk_start": (CHUNK_BUG_CLASSES[1], ChunkWindowEngine),
    "chunk_kv_unwritten": (CHUNK_BUG_CLASSES[2], UnwrittenChunkEngine),
}


class OverAdmittingScheduler(Scheduler):
    """The batch limit read as an inclusive bound (``>`` for ``>=``): ``max_batch + 1`` requests run at once."""

    def __init__(self, blocks: BlockManager, max_batch: int, requests: Iterable[Request]) -> None:
        super().__init__(blocks, max_batch + 1, requests)


class BackOfQueueScheduler(Scheduler):
    """A preempted request is appended to the *back* of the waiting queue, behind requests that
    never ran: the oldest request can starve."""

    def _preempt(self, request: Request) -> None:
        super()._preempt(request)
        self.waiting.remove(request)
        self.waiting.append(request)


class OverAdmittingEngine(Engine):
    scheduler_class = OverAdmittingScheduler


class BackOfQueueEngine(Engine):
    scheduler_class = BackOfQueueScheduler


class ChunksFirstEngine(Engine):
    """Under a token budget, prompt chunks take the step's tokens first and the running requests
    decode with what is left (prefill-first scheduling): while a long prompt is computed in chunks,
    requests already decoding stall. Every token and logit stays right; only the schedule shows it."""

    def _share_budget(self, scheduler: Scheduler, budget: int) -> tuple[list[Request], list[Request]]:
        batch = scheduler.schedule_decode()
        chunked, spent = self._prefill_chunks(scheduler, budget)
        return batch[: budget - spent], chunked


class SlotSeededEngine(Engine):
    """Each decode row samples from a generator seeded with ``seed + row``, made the first time
    the request decodes in that row (per-slot generators): a seeded request's tokens change with
    where it sits in the batch, and with every preemption that moves it."""

    def _decode(self, batch: list[Request], scheduler: Scheduler) -> None:
        for row, request in enumerate(batch):
            request.generator = _slot_generator(request, row)
        super()._decode(batch, scheduler)


class ReseedingEngine(Engine):
    """A readmitted request gets a fresh generator from its seed (the sampler state made when a
    request is scheduled): after each preemption its random stream starts over."""

    def _prefill_chunk(self, request: Request, budget: int, scheduler: Scheduler) -> int:
        if request.num_preemptions:  # no draw happens before a prompt's last chunk: resetting at each is the same
            request.generator = request.params.make_generator()
        return super()._prefill_chunk(request, budget, scheduler)


def _slot_generator(request: Request, row: int) -> torch.Generator | None:
    seed = request.params.seed
    if seed is None:
        return request.generator
    slots: dict[int, torch.Generator] = request.__dict__.setdefault("_slot_generators", {})
    if row not in slots:
        slots[row] = torch.Generator(device="cpu").manual_seed(seed + row)
    return slots[row]


SCHEDULE_ENGINES: dict[str, tuple[str, type[Engine], str]] = {
    "scheduler_admits_one_too_many": (SCHEDULE_BUG_CLASSES[0], OverAdmittingEngine, " ".join((OverAdmittingScheduler.__doc__ or "").split())),
    "preempted_to_back_of_queue": (SCHEDULE_BUG_CLASSES[1], BackOfQueueEngine, " ".join((BackOfQueueScheduler.__doc__ or "").split())),
    "sampler_seeded_by_batch_slot": (SCHEDULE_BUG_CLASSES[2], SlotSeededEngine, " ".join((SlotSeededEngine.__doc__ or "").split())),
    "sampler_reseeded_on_readmission": (SCHEDULE_BUG_CLASSES[2], ReseedingEngine, " ".join((ReseedingEngine.__doc__ or "").split())),
    "decode_starved_behind_chunks": (SCHEDULE_BUG_CLASSES[3], ChunksFirstEngine, " ".join((ChunksFirstEngine.__doc__ or "").split())),
}

__all__ = ["CHUNK_BUG_CLASSES", "CHUNK_ENGINES", "ChunkOverCacheView", "ChunksFirstEngine", "SCHEDULE_BUG_CLASSES", "SCHEDULE_ENGINES", "BackOfQueueScheduler", "OverAdmittingScheduler", "ReseedingEngine", "SlotSeededEngine"]
