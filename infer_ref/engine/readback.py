"""The captured runner's greedy decode loop: steps replayed on the device, tokens read back in chunks.

Each step of a :class:`~infer_ref.engine.capture.CapturedStep` writes its token and whether its
logits could decide one (an argmax over NaN logits is token 0, which must never be accepted as an
answer) into the step's device log, so a step is one graph replay. A chunk of ``READBACK_EVERY``
steps is copied to the host asynchronously and read while the next chunk runs: the device never
waits on the host, at the price of up to two chunks computed past an EOS or stop string (dropped).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING

import torch

from infer_ref.results import GenerationTiming
from infer_ref.validation import logits_error

if TYPE_CHECKING:
    from infer_ref.engine.capture import CapturedStep

# Tokens read back to the host at a time by the greedy loop (EOS / stop strings are checked then).
READBACK_EVERY = 16


def decode_greedy_on_device(
    capture: CapturedStep,
    steps: int,
    accept: Callable[[int], bool],
    timing: GenerationTiming,
    prompt_len: int,
) -> None:
    """Replay ``steps`` greedy steps, reading the step log back in chunks; per-step times from CUDA events.

    The capture was reset before the request's prefill, and its input holds the prefill's token:
    step ``i`` of this loop is logged at entry ``i``. ``accept`` takes each token in order and says
    when the request is over; the steps run past that are neither accepted nor timed.
    """
    device = capture.device
    cuda = device.type == "cuda"
    batch = capture.token_log.shape[1]
    tokens_host = torch.empty((steps, batch), dtype=torch.long, pin_memory=cuda)
    usable_host = torch.empty(steps, dtype=torch.bool, pin_memory=cuda)
    events: list[torch.cuda.Event] = []
    clocks: list[float] = []

    def mark() -> None:
        if cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        else:
            clocks.append(time.perf_counter())

    def fetch(start: int, end: int) -> torch.cuda.Event | None:
        # Steps [start, end) logged at entries [start, end): the capture was reset before step 0.
        tokens_host[start:end].copy_(capture.token_log[start:end], non_blocking=cuda)
        usable_host[start:end].copy_(capture.usable_log[start:end], non_blocking=cuda)
        if not cuda:
            return None
        done = torch.cuda.Event()
        done.record()
        return done

    used = steps  # steps whose tokens were accepted (the rest ran past the end and are dropped)

    def read(start: int, end: int, done: torch.cuda.Event | None) -> bool:
        """Accept the chunk's tokens (host side); True when generation is over."""
        nonlocal used
        if done is not None:
            done.synchronize()
        _check_chunk(usable_host[start:end].tolist(), start, prompt_len)
        for offset, token in enumerate(tokens_host[start:end, 0].tolist()):
            if accept(int(token)):
                used = start + offset + 1
                return True
        return False

    pending: tuple[int, int, torch.cuda.Event | None] | None = None
    chunk_start = 0
    finished = False
    mark()
    for i in range(steps):
        capture.step()
        mark()
        if i + 1 - chunk_start < READBACK_EVERY and i + 1 < steps:
            continue
        fetched = (chunk_start, i + 1, fetch(chunk_start, i + 1))
        chunk_start = i + 1
        if pending is not None and read(*pending):  # the previous chunk, while this one runs
            pending, finished = None, True
            break
        pending = fetched
    if pending is not None and not finished:
        read(*pending)
    if cuda:
        torch.cuda.synchronize(device)
        timing.decode_times_s.extend(a.elapsed_time(b) / 1e3 for a, b in pairwise(events[: used + 1]))
    else:
        timing.decode_times_s.extend(b - a for a, b in pairwise(clocks[: used + 1]))


def _check_chunk(usable: list[bool], first_step: int, prompt_len: int) -> None:
    """Raise for the first step of a chunk whose logits could not decide a token (named as the eager loop names it)."""
    if all(usable):
        return
    step = first_step + usable.index(False) + 1  # step 0 was the prefill's token
    raise logits_error(f"step {step} (position {prompt_len + step - 1})", "NaN, +inf or all -inf")
