"""Teacher-forced agreement of a decode path with a reference: KL and the reference token's log-prob.

Both sides are fed the same tokens; at each decoded step the path's next-token distribution is
compared with the reference's:

- ``KL(reference || path) = sum_v p_ref(v) * (log p_ref(v) - log p_path(v))``, the expected extra
  surprise of the path where the reference puts its mass;
- ``|log p_ref(t) - log p_path(t)|`` for ``t`` the token the reference chose at that step (the
  token both sides are fed next).

:func:`agreement` aggregates a run: the mean KL over steps and the max |Δlogprob| over steps.
Everything is computed in float64 from the rows given; a row holding NaN or an infinity is an
error, never a number (an argmax over NaN logits is token 0, which would look like an answer), and
so is a log-prob row that does not sum to probability 1 (logits passed where log-probs belong).

:func:`within_margin` decides whether a path agrees no worse than a baseline. Below the float32
reference's own resolution (:data:`REFERENCE_RESOLUTION`) differences are rounding of the
reference itself and are not ranked.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

# How far a log-prob row may be from normalized (|logsumexp|) and still count as log-probs.
NORMALIZATION_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class Agreement:
    """A path's teacher-forced agreement with the reference over ``steps`` decoded steps."""

    steps: int
    mean_kl: float
    max_abs_dlogprob: float

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


# The float32 reference's resolution: its logits (magnitude ~10) carry rounding of ~10 x 2^-24 ~ 1e-6
# per operation, accumulated over a few thousand-term reductions: |Δlogprob| below 1e-5 is within
# it, and KL, second order in the log-prob differences (~Δ^2 / 2), below 1e-10.
REFERENCE_RESOLUTION = Agreement(steps=0, mean_kl=1e-10, max_abs_dlogprob=1e-5)


def log_probs(logits: Tensor) -> Tensor:
    """float64 log-softmax over the last axis of ``logits`` ``[..., V]``; every logit must be finite."""
    _check_rows(logits, "logits")
    return torch.log_softmax(logits.to(torch.float64), dim=-1)


def kl_divergence(ref_logprobs: Tensor, path_logprobs: Tensor) -> Tensor:
    """``KL(ref || path)`` per row of two log-prob tensors ``[..., V]`` of the same shape (float64 ``[...]``)."""
    _check_pair(ref_logprobs, path_logprobs)
    ref, path = ref_logprobs.to(torch.float64), path_logprobs.to(torch.float64)
    # KL >= 0 for normalized rows (checked above); a negative sum is float64 rounding (~1e-17): 0.
    return (ref.exp() * (ref - path)).sum(dim=-1).clamp_min(0.0)


def token_logprob_delta(ref_logprobs: Tensor, path_logprobs: Tensor, token_ids: Tensor) -> Tensor:
    """``|ref[..., t] - path[..., t]|`` per row for the chosen tokens ``token_ids`` ``[...]`` (float64 ``[...]``)."""
    _check_pair(ref_logprobs, path_logprobs)
    if not isinstance(token_ids, Tensor) or token_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"token_ids must be an int64 or int32 tensor, got {type(token_ids).__name__} "
                        f"{getattr(token_ids, 'dtype', '')}")
    if tuple(token_ids.shape) != tuple(ref_logprobs.shape[:-1]):
        raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}; expected one id per row, "
                         f"shape {tuple(ref_logprobs.shape[:-1])}")
    vocab = ref_logprobs.shape[-1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise ValueError(f"token_ids must lie in [0, {vocab}), got ids from {int(token_ids.min())} "
                         f"to {int(token_ids.max())}")
    index = token_ids.to(device=ref_logprobs.device, dtype=torch.long).unsqueeze(-1)  # [..., 1]
    ref = ref_logprobs.to(torch.float64).gather(-1, index)
    path = path_logprobs.to(torch.float64).gather(-1, index)
    return (ref - path).abs().squeeze(-1)


def agreement(ref_logits: Tensor, path_logits: Tensor, token_ids: Tensor) -> Agreement:
    """Mean KL(ref || path) and max |Δlogprob| of ``token_ids`` over the steps of ``[steps, V]`` logit rows.

    ``token_ids`` ``[steps]`` are the reference's tokens: row ``i`` is the distribution of token ``i``.
    """
    if ref_logits.dim() != 2 or ref_logits.shape[0] == 0:
        raise ValueError(f"ref_logits must be [steps >= 1, vocab], got shape {tuple(ref_logits.shape)}")
    ref, path = log_probs(ref_logits), log_probs(path_logits.to(ref_logits.device))
    kl = kl_divergence(ref, path)  # [steps]
    delta = token_logprob_delta(ref, path, token_ids)  # [steps]
    return Agreement(steps=ref.shape[0], mean_kl=float(kl.mean()), max_abs_dlogprob=float(delta.max()))


def within_margin(path: Agreement, baseline: Agreement, margin: float) -> bool:
    """True when ``path`` agrees no worse than ``baseline`` x ``margin`` on both mean KL and max |Δlogprob|.

    A bound below :data:`REFERENCE_RESOLUTION` is raised to it: there both paths match the
    reference to within the reference's own rounding, and ranking them would rank rounding.
    """
    if not (math.isfinite(margin) and margin >= 1.0):
        raise ValueError(f"margin must be a finite number >= 1 (a path may not be held to better than "
                         f"the baseline), got {margin!r}")
    kl_bound = max(baseline.mean_kl * margin, REFERENCE_RESOLUTION.mean_kl)
    dlogprob_bound = max(baseline.max_abs_dlogprob * margin, REFERENCE_RESOLUTION.max_abs_dlogprob)
    return path.mean_kl <= kl_bound and path.max_abs_dlogprob <= dlogprob_bound


def _check_rows(rows: Tensor, name: str) -> None:
    if not isinstance(rows, Tensor) or not rows.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(rows).__name__} {getattr(rows, 'dtype', '')}")
    if rows.dim() == 0 or rows.shape[-1] == 0:
        raise ValueError(f"{name} must have a vocabulary axis of size >= 1, got shape {tuple(rows.shape)}")
    if not bool(torch.isfinite(rows).all()):
        bad = (~torch.isfinite(rows)).nonzero()[0].tolist()
        raise ValueError(f"{name} must be finite; first NaN or infinity at index {bad}")


def _check_pair(ref_logprobs: Tensor, path_logprobs: Tensor) -> None:
    for rows, name in ((ref_logprobs, "ref_logprobs"), (path_logprobs, "path_logprobs")):
        _check_rows(rows, name)
        offset = float(torch.logsumexp(rows.to(torch.float64), dim=-1).abs().max())
        if offset > NORMALIZATION_TOLERANCE:
            raise ValueError(f"{name} must be log-probabilities (each row's logsumexp 0), but a row's "
                             f"logsumexp is {offset:.3g} away from 0: pass log_probs(logits), not logits")
    if ref_logprobs.shape != path_logprobs.shape:
        raise ValueError(f"ref_logprobs and path_logprobs must have the same shape, got "
                         f"{tuple(ref_logprobs.shape)} and {tuple(path_logprobs.shape)}")
