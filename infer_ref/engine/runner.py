"""Running a model for requests: input preparation, timed prefill and decode forwards, token choice.

The runner computes where the model is, in its dtype (:func:`~infer_ref.devices.model_placement`);
it never moves anything. ``generate()`` runs one request through it (a prefill, then one decode
forward per token), the :class:`~infer_ref.engine.engine.Engine` many (each prefilled alone, then
decoded together, one row each). Which cache a forward sees is the caller's: any cache for
``generate()``, a view over the engine's block tables (:func:`block_table_cache`), or none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.pool import BlockPool
from infer_ref.devices import model_placement
from infer_ref.engine.block_manager import TokenSequence
from infer_ref.engine.sequence import Request
from infer_ref.sampling import sample_token


class ModelRunner:
    """A model's forwards for :class:`~infer_ref.engine.sequence.Request` objects."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.device, self.dtype = model_placement(model)

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

    def sync(self) -> None:
        """Wait for the device (so a forward's time is its own, and the clock stops after the work)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _forward(self, rows: list[list[int]], cache: Any) -> tuple[Tensor, float]:
        """The model on ``rows`` (equal lengths) with ``cache``: logits ``[B, T or 1, V]``, seconds."""
        input_ids = torch.tensor(rows, dtype=torch.long, device=self.device)  # [B, T]
        self.sync()
        t0 = time.perf_counter()
        logits = self.model(input_ids, kv_cache=cache)  # [B, T or 1, V]
        self.sync()
        return logits, time.perf_counter() - t0


def block_table_cache(pool: BlockPool, rows: Sequence[TokenSequence], layer_windows: Any) -> PagedKVCache:
    """The cache one engine forward sees: row ``b`` holds the computed positions of ``rows[b]`` in its
    block table (owned by the block manager) and writes the rest of its tokens after them."""
    tables = [s.block_table for s in rows]
    return PagedKVCache.over_blocks(pool, tables, [s.num_computed_tokens for s in rows], layer_windows=layer_windows)
