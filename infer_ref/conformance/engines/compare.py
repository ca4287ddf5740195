"""Self-consistency: one engine's answers to the same request under two schedules, compared.

Greedy tokens must be equal, except where the engine's own logprobs show a near-tie at the step
where they part (its top two within ``tol``, and the other run's token among its top ones): a chunk
split or a batch shape changes rounding, and rounding may flip a near-tie. After the first such
flip the two contexts differ and nothing later is compared. Up to there, every logprob both runs
report for a token must agree within ``tol``, and prompt logprobs likewise at every position.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer_ref.conformance.engines.protocol import EngineOutput, TokenLogprobs


def compare_outputs(a: EngineOutput, b: EngineOutput, tol: float) -> list[str]:
    """Problems found comparing ``b`` with ``a`` (empty: consistent)."""
    problems: list[str] = []
    for step, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=False)):
        problems += _compare_entries(f"step {step}", x, y, tol)
        if x.token != y.token:
            if not _near_tie(x, y.token, tol):
                problems.append(
                    f"step {step}: tokens {x.token} vs {y.token} and no near-tie (first run's top: {_fmt(x.top[:3])})"
                )
            return problems  # contexts differ from here on
    if a.token_ids != b.token_ids and len(a.token_ids) != len(b.token_ids) and not problems:
        problems.append(f"same tokens up to {min(len(a.token_ids), len(b.token_ids))}, then lengths {len(a.token_ids)} vs {len(b.token_ids)}")
    problems += compare_prompt_logprobs(a.prompt_logprobs, b.prompt_logprobs, tol)
    return problems


def compare_prompt_logprobs(
    a: Sequence[TokenLogprobs | None] | None, b: Sequence[TokenLogprobs | None] | None, tol: float
) -> list[str]:
    if a is None or b is None:
        return []
    if len(a) != len(b):
        return [f"prompt logprobs: {len(a)} vs {len(b)} positions"]
    out: list[str] = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if (x is None) != (y is None):
            out.append(f"prompt position {i}: one run has logprobs, the other none")
        elif x is not None and y is not None:
            out += _compare_entries(f"prompt position {i}", x, y, tol)
    return out


def _compare_entries(where: str, x: TokenLogprobs, y: TokenLogprobs, tol: float) -> list[str]:
    ours = dict(x.top) | {x.token: x.logprob}
    theirs = dict(y.top) | {y.token: y.logprob}
    out = []
    for token in sorted(set(ours) & set(theirs)):
        if not abs(ours[token] - theirs[token]) <= tol:
            out.append(f"{where}: token {token} logprob {ours[token]:.6f} vs {theirs[token]:.6f}")
    return out


def _near_tie(x: TokenLogprobs, other: int, tol: float) -> bool:
    ranked = dict(x.top)
    return other in ranked and x.logprob - ranked[other] <= tol


def _fmt(pairs: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"{t}: {lp:.4f}" for t, lp in pairs)
