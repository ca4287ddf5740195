"""Top-k logprobs from logits, for adapters whose engine hands out logits (infer_ref, transformers)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from infer_ref.conformance.engines.protocol import TokenLogprobs


def token_logprobs(logits: Tensor, token: int, k: int) -> TokenLogprobs:
    """``token``'s logprob and the top ``k`` of one row of ``logits`` ``[V]`` (log-softmax in float64),
    sorted from the most likely down, ties the lower id first (a stable sort: ``torch.topk`` leaves
    the order of ties unspecified, and gives [1, 2] for the top 2 of [0, 1, 0, -1])."""
    row = torch.log_softmax(logits.detach().double().cpu(), dim=-1)  # [V]
    values, ids = torch.sort(row, descending=True, stable=True)  # [V] each
    values, ids = values[:k], ids[:k]
    top = tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(int(token), float(row[int(token)]), top)


def prompt_logprobs_from(logits: Tensor, prompt: Sequence[int], k: int) -> tuple[TokenLogprobs | None, ...]:
    """Prompt logprobs from the logits ``[T-1, V]`` that predicted prompt tokens ``1..T-1``: None for
    position 0 (nothing precedes it), then one entry per later position."""
    rows = [token_logprobs(logits[i], prompt[i + 1], k) for i in range(len(prompt) - 1)]
    return (None, *rows)
