"""Which requests run: first-come first-served admission, room for every decode step, preemption.

A request is *waiting* (in arrival order), *prefilling* (admitted, its prompt computed in chunks
under a per-step token budget: ``Engine(max_num_batched_tokens=...)``) or *running* (prefilled,
decoding). The scheduler asks the block manager for blocks and never runs the model: the engine
prefills what it admits and decodes what it schedules.

- **Admission**, in order, while fewer than ``max_batch`` run and the pool can hold the head of the
  queue: the block manager gives it a table (a prefix hit covers its first ``num_cached_tokens``
  tokens). A request that cannot be admitted waits, and so does everything behind it.
- **Decode room**: every running request gets room for its newest token (a new block when its
  last one is full). When none is free, the most recently admitted request (a prefilling one
  first: they were admitted last) is *preempted*: its blocks are freed and it goes back to the head
  of the queue with every token it has so far, to be recomputed (through the prefix cache) when
  room returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infer_ref.engine.block_manager import BlockManager, TokenSequence
from infer_ref.engine.sequence import Request


@dataclass(frozen=True)
class ScheduleStep:
    """Who one engine step decoded (request indices, batch order), who waited (queue order, head
    first) and, with chunked prefill, whose prompt was being computed (admission order: those a
    chunk ran for and those admitted but left without one this step)."""

    running: tuple[int, ...]
    waiting: tuple[int, ...]
    prefilling: tuple[int, ...] = ()


class Scheduler:
    """The waiting queue and the running batch of one ``Engine.generate`` call."""

    def __init__(self, blocks: BlockManager, max_batch: int, requests: Iterable[Request]) -> None:
        self.blocks = blocks
        self.max_batch = max_batch
        self.waiting: deque[Request] = deque(requests)
        self.running: list[Request] = []
        self.prefilling: list[Request] = []  # admitted, prompt not yet all computed (chunked prefill), admission order
        self.num_preemptions = 0
        self.peak_blocks_used = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    def next_admission(self) -> Request | None:
        """The head of the queue, its blocks allocated (prefix hits claimed), or None when it must wait."""
        if not self.waiting or len(self.running) + len(self.prefilling) >= self.max_batch:
            return None
        request = self.waiting[0]
        seq = _blocks_of(request)
        if not self.blocks.can_allocate(seq):
            if not self.running and not self.prefilling:  # everything is free and it still does not fit: the engine's checks missed a case
                raise RuntimeError(
                    f"request {request.index} cannot be allocated in an idle pool of {self.blocks.pool.num_blocks} blocks"
                )
            return None
        self.waiting.popleft()
        self.blocks.allocate(seq)
        if request.num_cached_tokens is None:  # the first admission counts, not a readmission
            request.num_cached_tokens = seq.num_cached_tokens
        self._track_peak()
        return request

    def start(self, request: Request) -> None:
        """A prefilled request that goes on decoding."""
        if request in self.prefilling:
            self.prefilling.remove(request)
        self.running.append(request)

    def begin_prefill(self, request: Request) -> None:
        """An admitted request whose prompt is computed in chunks, a step at a time."""
        self.prefilling.append(request)

    def finish(self, request: Request) -> None:
        """A request that is done: its blocks are freed (its full blocks stay cached for later hits)."""
        for group in (self.running, self.prefilling):
            if request in group:
                group.remove(request)
        self.blocks.deallocate(_blocks_of(request))

    def schedule_decode(self) -> list[Request]:
        """The running requests, each with room for its newest token; preempts until they fit."""
        i = 0
        while i < len(self.running):
            seq = _blocks_of(self.running[i])
            if self.blocks.can_append(seq):
                self.blocks.append(seq)
                i += 1
            elif self.prefilling:
                self._preempt(self.prefilling.pop())  # admitted after every running request
            else:
                self._preempt(self.running.pop())  # the most recently admitted (maybe running[i] itself)
        if self.running:
            self._track_peak()
        return list(self.running)

    def step(self, decoded: Sequence[Request] | None = None, chunked: Sequence[Request] = ()) -> ScheduleStep:
        """The step that decoded ``decoded`` (default: the running batch) and ran prompt chunks for
        ``chunked``, with the waiting queue and the prompts still being computed as they are now."""
        decoded = self.running if decoded is None else decoded
        prefilling = list(chunked) + [r for r in self.prefilling if r not in chunked]
        return ScheduleStep(tuple(r.index for r in decoded), tuple(r.index for r in self.waiting), tuple(r.index for r in prefilling))

    def _preempt(self, request: Request) -> None:
        self.blocks.deallocate(_blocks_of(request))  # its tokens stay: readmission recomputes them (hits included)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _track_peak(self) -> None:
        self.peak_blocks_used = max(self.peak_blocks_used, self.blocks.pool.num_used)


def _blocks_of(request: Request) -> TokenSequence:
    assert request.seq is not None, "an engine request always has its block sequence"
    return request.seq
