"""Next-token selection (the parameters themselves, :class:`SamplingParams`, are in :mod:`infer_ref.sampling_params`).

Order of operations (as in transformers' logits processors): repetition penalty, then greedy argmax
at temperature 0, else temperature, top-k, top-p, and a draw from a CPU ``torch.Generator`` so that
a seed gives the same tokens on every device and on the cached and uncached paths.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from infer_ref.sampling_params import MAX_SEED as MAX_SEED  # re-exported: callers import them from here
from infer_ref.sampling_params import SamplingParams as SamplingParams
from infer_ref.validation import check_logits


def apply_repetition_penalty(logits: Tensor, context: Sequence[int], penalty: float) -> Tensor:
    """Divide positive logits (multiply negative ones) of tokens seen in ``context`` by ``penalty``."""
    if penalty == 1.0 or not context:
        return logits
    ids = torch.tensor(sorted(set(context)), device=logits.device)
    seen = logits[ids]
    out = logits.clone()
    out[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return out


def filter_top_k_top_p(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Set every logit outside the top-k / top-p set to -inf (``logits`` is ``[V]``)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - top_p
        drop_sorted[-1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def warp_logits(logits: Tensor, context: Sequence[int], params: SamplingParams) -> Tensor:
    """The logits ``[V]`` a token is drawn from, in ``logits``' dtype: repetition penalty, then
    (unless greedy) temperature, top-k and top-p, with -inf outside the kept support."""
    logits = apply_repetition_penalty(logits, context, params.repetition_penalty)
    if params.greedy:
        return logits
    return filter_top_k_top_p(_scale(logits, params.temperature), params.top_k, params.top_p)


def sample_token(
    logits: Tensor,
    context: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    where: str = "the sampled position",
) -> int:
    """Choose the next token from ``logits`` ``[V]`` given the tokens so far.

    Logits that cannot decide a token (any NaN or +inf, or all -inf) raise
    :class:`~infer_ref.errors.NonFiniteError` naming ``where`` (a step and position), never token 0.
    """
    if logits.dim() != 1:
        raise ValueError(f"sample_token expects logits of shape [vocab], got {tuple(logits.shape)}")
    check_logits(logits, where=where)
    logits = warp_logits(logits.float(), context, params)
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())


def _scale(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature``; shifted by the maximum first when a tiny temperature would overflow.

    softmax is shift-invariant, so the shift changes nothing but the overflow: with it the best
    token scales to 0 and the others to large negatives or -inf, instead of inf - inf = NaN.
    Temperatures too small for float32 (which would round to 0) are applied in float64.
    """
    scaled = logits / temperature
    if bool(torch.isposinf(scaled).any()) or bool(torch.isnan(scaled).any()):
        wide = logits.double()  # float64: a temperature below float32's range would round to 0
        scaled = (wide - wide.max()) / temperature
    return scaled
