"""What a KV cache must provide to the models and to the conformance suite.

The models call ``seq_len``, ``update`` and ``advance`` (and ``num_layers`` / ``remaining_capacity``
to refuse a forward before anything is written); ``generate`` and the suite also use the capacity
helpers. Any object with these members can be driven by infer_ref's models and tested by
``infer_ref.conformance``.

Before its first layer a forward asks :func:`plan_step` for its :class:`~infer_ref.step.Step`
(positions, masks, lengths, block tables), which every layer then receives as an argument. An
infer_ref cache (a :class:`~infer_ref.cache.base.CacheBase`) builds it with its ``plan_step``; any
other cache holds ``seq_len`` positions in every row, and its step is the causal / sliding one over
``[0, seq_len+t)`` (:func:`infer_ref.step.contiguous_step`). The attention then writes K/V with
``update`` and attends over what it returns with the step's mask: a cache whose ``update`` returns
more slots than ``seq_len + T`` (a static buffer of ``S_max`` slots, rows padded to the longest)
plans masks hiding every slot that does not hold a position ``<= pos + i`` of that row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from infer_ref.cache.base import CacheBase
from infer_ref.step import Step, contiguous_step


@runtime_checkable
class KVCacheProtocol(Protocol):
    @property
    def seq_len(self) -> int:
        """Positions filled so far (the RoPE offset of the next token)."""
        ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at ``[seq_len, seq_len+T)``; return K/V for ``[0, seq_len+T)``."""
        ...

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` once every layer has written its entries."""
        ...

    def reset(self) -> None: ...

    @property
    def is_full(self) -> bool: ...

    @property
    def remaining_capacity(self) -> int: ...


def plan_step(cache: KVCacheProtocol | None, t: int, windows: Sequence[int | None], device: torch.device) -> Step:
    """The :class:`Step` of a forward writing ``t`` tokens into ``cache`` (None: no cache, positions from 0)."""
    if cache is None:
        return contiguous_step(0, t, windows, device)
    if isinstance(cache, CacheBase):
        return cache.plan_step(t, windows)
    return contiguous_step(cache.seq_len, t, windows, device)

