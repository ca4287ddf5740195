"""Running a model for requests: input preparation, timed prefill and decode forwards, token choice.

The runner computes where the model is, in its dtype (:func:`~infer_ref.devices.model_placement`);
it never moves anything. ``generate()`` runs one request through it (a prefill, then one decode
forward per token), the :class:`~infer_ref.engine.engine.Engine` many (each prefilled alone, then
decoded together, one row each). Which cache a forward sees is the caller's: any cache for
``generate()``, a view over the engine's block tables (:func:`block_table_cache`), or none.

With a capture (:class:`~infer_ref.engine.capture.CapturedStep`, ``generate(decode="fast")``) the
prefill runs eagerly into the capture's static cache and each decode forward is the captured step,
fed through its input buffer; greedy requests decode on the device (``readback.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.pool import BlockPool
from infer_ref.devices import model_placement
from infer_ref.engine.block_manager import TokenSequence
from infer_ref.engine.readback import decode_greedy_on_device
from infer_ref.engine.sequence import Request
from infer_ref.sampling import sample_token

if TYPE_CHECKING:
    from infer_ref.engine.capture import CapturedStep


class ModelRunner:
    """A model's forwards for :class:`~infer_ref.engine.sequence.Request` objects; with ``capture``,
    its decode forwards are that captured step (which holds the cache they run on)."""

    def __init__(self, model: nn.Module, capture: CapturedStep | None = None) -> None:
        self.model = model
        self.device, self.dtype = model_placement(model)
        self.capture = capture

    def prefill(self, request: Request, token_ids: Sequence[int], cache: Any) -> Tensor:
        """Run the request's uncomputed tokens ``token_ids`` in one forward (``[1, T]``); the logits
        ``[V]`` of its last position, from which its next token is chosen."""
        logits, elapsed = self._forward([list(token_ids)], cache)  # [1, T or 1, V]
        request.timing.prefill_time_s += elapsed  # a preempted request is prefilled again: both count
        return logits[0, -1]

    def decode(self, requests: Sequence[Request], cache: Any, *, recompute: bool = False) -> Tensor:
        """One batched forward feeding each request its newest token (``[B, 1]``; with ``recompute``,
        no cache: one request's whole sequence, ``[1, T]``); logits ``[B, V]``."""
        rows = [r.collector.tokens if recompute else r.collector.tokens[-1:] for r in requests]
        if self.capture is not None:
            assert cache is self.capture.cache and not recompute, "a captured step decodes on its own cache"
            self.capture.set_input([row[-1] for row in rows])  # checked ids into the step's input buffer
            logits, elapsed = self._timed(self.capture.step)  # [B, 1, V]
        else:
            logits, elapsed = self._forward(rows, cache)  # [B, 1 or T, V]
        for request in requests:
            request.timing.decode_times_s.append(elapsed)
        return logits[:, -1]

    def take_token(self, request: Request, logits: Tensor) -> bool:
        """Choose (or, teacher-forced, take) the request's next token from ``logits`` ``[V]``; True
        when that ended the request."""
        if request.keep_logits:
            request.logits.append(logits.detach().clone())
        if request.forced is not None:
            token = request.forced[request.step]
        else:
            tokens = request.collector.tokens
            token = sample_token(logits, tokens, request.params, request.generator, where=request.where())
        return request.accept(token)

    def decodes_on_device(self, request: Request) -> bool:
        """Whether ``request`` can decode through :meth:`decode_on_device`: a captured step, greedy
        tokens without a repetition penalty (the step's own argmax), nothing forced or kept."""
        params = request.params
        return (
            self.capture is not None and params.greedy and params.repetition_penalty == 1.0
            and request.forced is None and not request.keep_logits
        )  # fmt: skip

    def decode_on_device(self, request: Request) -> None:
        """Decode ``request`` to its end on the device, right after its prefill into the (reset)
        capture: each step feeds the previous step's argmax; tokens are read back in chunks."""
        assert self.capture is not None and self.decodes_on_device(request)
        self.capture.set_input(request.collector.tokens[-1:])  # the prefill's token
        decode_greedy_on_device(
            self.capture,
            request.params.max_new_tokens - request.step,
            request.accept,
            request.timing,
            prompt_len=len(request.collector.tokens) - request.step,
        )

    def sync(self) -> None:
        """Wait for the device (so a forward's time is its own, and the clock stops after the work)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _forward(self, rows: list[list[int]], cache: Any) -> tuple[Tensor, float]:
        """The model on ``rows`` (equal lengths) with ``cache``: logits ``[B, T or 1, V]``, seconds."""
        input_ids = torch.tensor(rows, dtype=torch.long, device=self.device)  # [B, T]
        return self._timed(lambda: self.model(input_ids, kv_cache=cache))  # [B, T or 1, V]

    def _timed(self, forward: Callable[[], Tensor]) -> tuple[Tensor, float]:
        """``forward()`` and the seconds it took on the device."""
        self.sync()
        t0 = time.perf_counter()
        logits = forward()
        self.sync()
        return logits, time.perf_counter() - t0


def block_table_cache(
    pool: BlockPool, rows: Sequence[TokenSequence], layer_windows: Any, cache_class: type[PagedKVCache] = PagedKVCache
) -> PagedKVCache:
    """The cache one engine forward sees: row ``b`` holds the computed positions of ``rows[b]`` in its
    block table (owned by the block manager) and writes the rest of its tokens after them."""
    tables = [s.block_table for s in rows]
    return cache_class.over_blocks(pool, tables, [s.num_computed_tokens for s in rows], layer_windows=layer_windows)
