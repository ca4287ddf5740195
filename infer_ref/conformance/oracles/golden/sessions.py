"""Sessions: "run a sequence through a cache" adapters for each implementation, what the verifier drives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.oracles.transformers_cache import forward_with_cache

StepFn = Callable[[Sequence[int]], Tensor]
"""Append token ids to the sequence held in a cache; return the logits ``[V]`` of the last one."""
SessionFactory = Callable[[int], StepFn]
"""Start a new sequence with an empty cache able to hold ``max_len`` tokens."""


def infer_ref_sessions(model: Any, *, device: str | torch.device) -> SessionFactory:
    """Sessions over infer_ref's contiguous :class:`~infer_ref.cache.KVCache`."""
    from infer_ref.cache import KVCache

    dtype = next(model.parameters()).dtype

    def start(max_len: int) -> StepFn:
        cache = KVCache.from_model_config(model.config, max_len, dtype=dtype, device=device)

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, T]
            return model(x, kv_cache=cache)[0, -1]  # [V]

        return step

    return start


def transformers_sessions(model: Any) -> SessionFactory:
    """Sessions over transformers' own cached path (the ``DynamicCache`` its forward creates)."""
    device = next(model.parameters()).device

    def start(max_len: int) -> StepFn:
        state: dict[str, Any] = {"cache": None}

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)
            out, state["cache"] = forward_with_cache(model, state["cache"], input_ids=x, use_cache=True, logits_to_keep=1)
            return out.logits[0, -1]

        return step

    return start


def transformers_uncached_sessions(model: Any) -> SessionFactory:
    """transformers recomputing the whole sequence at every step (no cache): the noise reference."""
    device = next(model.parameters()).device

    def start(max_len: int) -> StepFn:
        seq: list[int] = []

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            seq.extend(int(t) for t in ids)
            x = torch.tensor([seq], dtype=torch.long, device=device)
            return model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1]

        return step

    return start


def adapter_sessions(adapter: Any, model: Any, *, device: str | torch.device) -> SessionFactory:
    """Sessions through a conformance adapter: its ``make_model_cache`` and ``forward``."""
    assert adapter.make_model_cache is not None and adapter.forward is not None

    def start(max_len: int) -> StepFn:
        cache = adapter.make_model_cache(model, max_len, 1)

        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, T]
            return adapter.forward(model, x, cache)[0, -1]  # [V]

        return step

    return start
