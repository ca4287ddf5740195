"""Which keys a query sees: the causal and sliding-window masks, the torch definitions.

A mask is bool, True where a query may see a key: ``[T, S]`` when every row of the batch sits at the
same positions, ``[B, T, S]`` when rows hold different lengths (a batch of requests). The caches
build a step's masks from these (``infer_ref/step.py``); attention only applies them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def attention_mask(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
    """Which keys each new query may see, or None when it may see every key.

    Query ``i`` sits at absolute position ``start + i``; keys are positions ``0 .. start+q_len-1``
    (cache plus the new tokens), so the mask is ``[q_len, start+q_len]``, bottom-right aligned.
    Key ``j`` is visible iff ``j <= pos`` and, with a window, ``pos - window < j``.
    """
    kv_len = start + q_len
    if q_len == 1 and (window is None or kv_len <= window):
        return None  # one query at the end of the sequence, nothing out of its window
    return visible_keys(torch.arange(start, kv_len, device=device), kv_len, window)


def visible_keys(query_positions: Tensor, num_keys: int, window: int | None) -> Tensor:
    """Mask ``[..., T, S]`` for queries at ``query_positions`` ``[..., T]`` over key positions ``0..S-1``.

    Key ``j`` is visible to a query at ``p`` iff ``j <= p`` and, with a window, ``p - window < j``.
    Keys past a row's own end are therefore hidden too (``j > p``), which is what batches of rows with
    different lengths (padded to the longest) rely on.
    """
    q_pos = query_positions[..., :, None]  # [..., T, 1]
    k_pos = torch.arange(num_keys, device=query_positions.device)  # [S]
    visible = k_pos <= q_pos
    if window is not None:
        visible = visible & (k_pos > q_pos - window)
    return visible  # [..., T, S]


__all__ = ["attention_mask", "visible_keys"]
