"""Self-consistency: one engine's answers to the same request under two schedules, compared.

Greedy tokens must be equal, except where the engine's own logprobs show a near-tie at the step
where they part (its top two within ``tol``, and the other run's token among its top ones): a chunk
split or a batch shape changes rounding, and rounding may flip a near-tie. After the first such
flip the two contexts differ and nothing later is compared. Up to there, every logprob both runs
report for a token must agree within ``tol``, and prompt logprobs likewise at every position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from infer_ref.conformance.engines.protocol import EngineOutput, TokenLogprobs


def compare_outputs(a: EngineOutput, b: EngineOutput, tol: float) -> list[str]:
    """Problems found comparing ``b`` with ``a`` (empty: consistent)."""
    problems: list[str] = []
    for where, x, y in _generated_pairs(a, b):
        problems += _compare_entries(where, x, y, tol)
        if x.token != y.token and not _near_tie(x, y, tol):
            problems.append(
                f"{where}: tokens {x.token} vs {y.token} and no near-tie (first run's top: {_fmt(x.top[:3])})"
            )
    if _same_tokens(a, b) and len(a.token_ids) != len(b.token_ids) and not problems:
        problems.append(
            f"same tokens up to {min(len(a.token_ids), len(b.token_ids))}, then lengths {len(a.token_ids)} "
            f"vs {len(b.token_ids)}"
        )
    return problems + compare_prompt_logprobs(a.prompt_logprobs, b.prompt_logprobs, tol)


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
    for where, x, y in _prompt_pairs(a, b):
        out += _compare_entries(where, x, y, tol)
    return out


def largest_difference(a: EngineOutput, b: EngineOutput) -> float:
    """The largest |difference| between logprobs both runs report for a token at a position both
    judge (the steps up to the first flip, the prompt positions): what the tolerance must cover
    between two correct schedules of one engine."""
    pairs = [*_generated_pairs(a, b), *_prompt_pairs(a.prompt_logprobs, b.prompt_logprobs)]
    return max((abs(lx - ly) for _, x, y in pairs for _, lx, ly in _shared_logprobs(x, y)), default=0.0)


def seeded_tokens_differ(alone: EngineOutput, other: EngineOutput, *, exact: bool) -> str | None:
    """Why ``other`` (a seeded request under another schedule) is not ``alone``'s answer, or None.

    ``exact`` (float32, float64): the same tokens. In bfloat16 and float16 another batch shape or a
    recompute after preemption changes a step's logits by rounding, and the same seeded draw may
    then pick another token: the tokens may part at the first step whose reported logprobs differ
    between the runs, or later — never while both runs have reported the very same distribution,
    where the same draw must choose the same token."""
    if exact or alone.token_ids == other.token_ids:
        return None if alone.token_ids == other.token_ids else f"{other.token_ids}, alone: {alone.token_ids}"
    for step, (x, y) in enumerate(zip(alone.logprobs, other.logprobs, strict=False)):
        rows_differ = x.top != y.top or (x.token == y.token and x.logprob != y.logprob)
        if rows_differ:
            return None  # rounding reached the draws here: what follows is not comparable
        if x.token != y.token and not x.top:
            return (
                None  # only each run's own chosen logprob: nothing shows the two distributions were the same
            )
        if x.token != y.token:
            return (
                f"step {step}: token {y.token} vs {x.token} alone, with the same reported distribution in "
                "both runs "
                f"({_fmt(x.top[:3])}): the same seeded draw chose differently; {other.token_ids}, alone: "
                f"{alone.token_ids}"
            )
    return f"{other.token_ids}, alone: {alone.token_ids} (no logprobs where they part)"


def _generated_pairs(a: EngineOutput, b: EngineOutput) -> Iterator[tuple[str, TokenLogprobs, TokenLogprobs]]:
    """Both runs' entries step by step, the step where the tokens part last: after it the two
    contexts differ and nothing can be compared."""
    for step, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=False)):
        yield f"step {step}", x, y
        if x.token != y.token:
            return


def _prompt_pairs(
    a: Sequence[TokenLogprobs | None] | None, b: Sequence[TokenLogprobs | None] | None
) -> Iterator[tuple[str, TokenLogprobs, TokenLogprobs]]:
    if a is None or b is None or len(a) != len(b):
        return
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is not None and y is not None:
            yield f"prompt position {i}", x, y


def _same_tokens(a: EngineOutput, b: EngineOutput) -> bool:
    return all(x == y for x, y in zip(a.token_ids, b.token_ids, strict=False))


def _shared_logprobs(x: TokenLogprobs, y: TokenLogprobs) -> list[tuple[int, float, float]]:
    """``(token, x's logprob, y's logprob)`` for every token both entries report, in token order."""
    ours = dict(x.top) | {x.token: x.logprob}
    theirs = dict(y.top) | {y.token: y.logprob}
    return [(t, ours[t], theirs[t]) for t in sorted(set(ours) & set(theirs))]


def _compare_entries(where: str, x: TokenLogprobs, y: TokenLogprobs, tol: float) -> list[str]:
    return [
        f"{where}: token {t} logprob {lx:.6f} vs {ly:.6f}"
        for t, lx, ly in _shared_logprobs(x, y)
        if not abs(lx - ly) <= tol
    ]


def _near_tie(x: TokenLogprobs, y: TokenLogprobs, tol: float) -> bool:
    """Whether greedy choices ``x.token`` and ``y.token`` can part by rounding: ``y``'s token within
    ``tol`` of ``x``'s in ``x``'s own top list. An engine that reports no alternatives gives only the
    two chosen logprobs: each is its run's maximum, so a near-tie makes them equal within ``tol``."""
    if not x.top:
        return abs(x.logprob - y.logprob) <= tol
    ranked = dict(x.top)
    return y.token in ranked and x.logprob - ranked[y.token] <= tol


def _fmt(pairs: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"{t}: {lp:.4f}" for t, lp in pairs)
