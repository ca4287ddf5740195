"""Tie-aware comparison of two teacher-forced runs in low precision (bf16 on CUDA).

Two correct runs of the same tokens through different paths (prefix cache on vs off, a request in
a batch vs alone) agree only to rounding in bf16, and greedy runs diverge at near-ties. So one
run's tokens are *forced* into the other (the engine's ``forced_tokens``) and each step is judged
like a golden file (``infer_ref.conformance.oracles.golden``): the forced token's logprob is within ``eps`` of the best
logprob of the other run (tie-aware), and the reference's top-k logprobs are within ``topk_atol``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer_ref.conformance.oracles.golden import Tolerance


@dataclass(frozen=True)
class TeacherForcedReport:
    steps: int
    max_deficit: float  # max over steps of best logprob - forced token's logprob (other run)
    max_abs_dlogprob: float  # max |Δ logprob| over the reference's top-k tokens
    exact_steps: int  # steps where both runs' argmax is the forced token
    tolerance: Tolerance

    @property
    def ok(self) -> bool:
        return self.max_deficit <= self.tolerance.eps and self.max_abs_dlogprob <= self.tolerance.topk_atol

    def summary(self) -> str:
        return (
            f"{self.steps} steps: max deficit {self.max_deficit:.4g} (eps {self.tolerance.eps}), "
            f"max |Δlogprob| top-k {self.max_abs_dlogprob:.4g} (tol {self.tolerance.topk_atol}), "
            f"argmax equal at {self.exact_steps}/{self.steps} steps: {'ok' if self.ok else 'FAILED'}"
        )


def compare_teacher_forced(
    reference: Tensor, forced_tokens: list[int], other: Tensor, tolerance: Tolerance, top_k: int = 5
) -> TeacherForcedReport:
    """``reference`` / ``other``: logits ``[n, V]`` of the two runs at the same ``n`` forced steps."""
    if reference.dim() != 2 or reference.shape != other.shape or reference.shape[0] != len(forced_tokens):
        raise ValueError(
            f"need logits of equal shape [n, V] for n = {len(forced_tokens)} forced tokens, got "
            f"{tuple(reference.shape)} and {tuple(other.shape)}"
        )
    ref_lp = torch.log_softmax(reference.float(), dim=-1)  # [n, V]
    oth_lp = torch.log_softmax(other.float(), dim=-1)
    ids = torch.tensor(forced_tokens, device=other.device)[:, None]  # [n, 1]
    deficit = oth_lp.max(dim=-1).values - oth_lp.gather(-1, ids)[:, 0]  # [n]
    top = ref_lp.topk(min(top_k, ref_lp.shape[-1]), dim=-1).indices  # [n, k]
    dlp = (ref_lp.gather(-1, top) - oth_lp.gather(-1, top)).abs()  # [n, k]
    exact = (ref_lp.argmax(-1) == ids[:, 0]) & (oth_lp.argmax(-1) == ids[:, 0])
    return TeacherForcedReport(
        steps=len(forced_tokens),
        max_deficit=float(deficit.max()),
        max_abs_dlogprob=float(dlp.max()),
        exact_steps=int(exact.sum()),
        tolerance=tolerance,
    )
