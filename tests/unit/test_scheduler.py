"""The engine's scheduler alone: FCFS admission under the batch and pool limits, preemption order."""

from __future__ import annotations

from infer_ref.engine.block_manager import BlockManager
from infer_ref.engine.scheduler import Scheduler
from infer_ref.engine.sequence import Request
from infer_ref.sampling import SamplingParams

BLOCK = 4


def _request(index: int, prompt_len: int) -> Request:
    prompt = [index * 100 + t for t in range(prompt_len)]  # distinct tokens: no prefix hits between requests
    return Request.new(index, prompt, SamplingParams(max_new_tokens=8), None, (), with_blocks=True)


def _admit_all(scheduler: Scheduler) -> list[int]:
    admitted = []
    while (request := scheduler.next_admission()) is not None:
        scheduler.start(request)
        admitted.append(request.index)
    return admitted


def test_admission_is_first_come_first_served_and_the_head_blocks_the_queue() -> None:
    # 4 blocks of 4 positions: request 0 takes 2 blocks, request 1 needs 3 (only 2 left), request 2 needs 1.
    blocks = BlockManager.with_blocks(4, BLOCK)
    scheduler = Scheduler(blocks, max_batch=8, requests=[_request(0, 8), _request(1, 12), _request(2, 4)])
    assert _admit_all(scheduler) == [0]  # request 2 would fit, but it never overtakes request 1
    assert [r.index for r in scheduler.waiting] == [1, 2]
    assert scheduler.peak_blocks_used == 2
    scheduler.finish(scheduler.running[0])
    assert _admit_all(scheduler) == [1, 2]


def test_max_batch_limits_the_running_set() -> None:
    scheduler = Scheduler(BlockManager.with_blocks(16, BLOCK), max_batch=2, requests=[_request(i, 4) for i in range(3)])
    assert _admit_all(scheduler) == [0, 1] and [r.index for r in scheduler.waiting] == [2]


def test_no_room_to_decode_preempts_the_most_recently_admitted_to_the_head_of_the_queue() -> None:
    # 3 blocks: requests 0 and 1 each fill one block exactly; their next tokens need a block each.
    blocks = BlockManager.with_blocks(3, BLOCK)
    scheduler = Scheduler(blocks, max_batch=8, requests=[_request(0, 4), _request(1, 4), _request(2, 4)])
    assert _admit_all(scheduler) == [0, 1, 2]
    for request in scheduler.running:  # each prefilled and chose a token: one more position to hold
        assert request.seq is not None
        blocks.commit(request.seq, len(request.seq))
        request.accept(7)
    batch = scheduler.schedule_decode()
    assert [r.index for r in batch] == [0]  # 2, then 1, gave their blocks back
    assert [r.index for r in scheduler.waiting] == [1, 2] and scheduler.num_preemptions == 2
    assert [r.num_preemptions for r in (batch[0], *scheduler.waiting)] == [0, 1, 1]
    assert scheduler.waiting[0].num_cached_tokens == 0  # set at the first admission, kept on readmission


def test_every_preemption_of_a_request_is_counted() -> None:
    # 2 blocks of 4: request 1 is preempted for request 0, readmitted once 0 finished, then preempted again.
    blocks = BlockManager.with_blocks(2, BLOCK)
    scheduler = Scheduler(blocks, max_batch=8, requests=[_request(0, 4), _request(1, 4)])
    assert scheduler.peak_blocks_used == 0  # nothing admitted yet
    assert _admit_all(scheduler) == [0, 1]
    for request in scheduler.running:
        assert request.seq is not None
        blocks.commit(request.seq, len(request.seq))
        request.accept(7)  # 5 tokens each: a second block each, one free after preempting request 1
    assert [r.index for r in scheduler.schedule_decode()] == [0]
    first, second = scheduler.running[0], scheduler.waiting[0]
    scheduler.finish(first)
    assert _admit_all(scheduler) == [1]  # 5 tokens in 2 blocks, the pool's whole size
    assert second.seq is not None
    blocks.commit(second.seq, len(second.seq))
    for token in (8, 9, 10, 11):  # 9 tokens need a third block: none exists
        second.accept(token)
    blocks.commit(second.seq, 8)
    assert scheduler.schedule_decode() == []
    assert (second.num_preemptions, first.num_preemptions, scheduler.num_preemptions) == (2, 0, 2)
    assert scheduler.peak_blocks_used == 2


def test_a_request_keeps_no_logits_and_no_blocks_unless_asked() -> None:
    request = Request.new(0, [1, 2], SamplingParams(max_new_tokens=2), None, ())
    assert (request.keep_logits, request.seq, request.forced) == (False, None, None)
