"""Comparison helpers whose failures say everything needed to act on them.

On failure each helper raises ``AssertionError`` with: what was compared, shapes and dtypes, the
largest error, the first differing position (row-major) with both values and a few neighbours, the
drawn parameters, and a one-line command that re-runs exactly that test against the same
implementation (the ``ci`` profile is derandomized, so the same examples are drawn again).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance import tiers
from infer_ref.conformance.rerun import ADAPTER_TESTS, rerun_command

_CONTEXT: dict[str, str] = {}


def set_run_context(**values: str) -> None:
    """Recorded by the pytest plugin: ``impl``, the --ir-impl spec of this run."""
    _CONTEXT.update(values)


def repro_command() -> str:
    """``pytest --pyargs <module> -k <test> --ir-impl=... --hypothesis-profile=...`` for the test now
    running: a command that works from a wheel install as from a checkout (:mod:`.rerun`)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    node = current.rsplit(" (", 1)[0] if current else ""
    options = []
    if "impl" in _CONTEXT:
        options.append(f"--ir-impl={_CONTEXT['impl']}")
    for option in ("device", "dtype"):
        if _CONTEXT.get(option) not in (None, "cpu", "float64"):
            options.append(f"--ir-{option}={_CONTEXT[option]}")
    if tiers.strict_float64():
        options.append("--ir-strict-float64")
    from hypothesis import settings

    options.append(f"--hypothesis-profile={settings.get_current_profile_name()}")
    if not node:  # called outside a running test
        return f"pytest --pyargs {ADAPTER_TESTS} -p no:xdist -k '<test id>' {' '.join(options)}"
    return rerun_command(node, " ".join(options))


def _format_params(params: Mapping[str, Any] | None) -> str:
    if not params:
        return "  (none)"
    return "\n".join(f"  {k} = {v!r}" for k, v in params.items())


def _fail(title: str, body: Sequence[str], params: Mapping[str, Any] | None) -> None:
    lines = [title, *body, "drawn parameters:", _format_params(params), f"repro: {repro_command()}"]
    raise AssertionError("\n".join(lines))


def _neighbourhood(t: Tensor, index: tuple[int, ...], span: int = 3) -> str:
    if t.dim() == 0:
        return repr(t.item())
    row = t[index[:-1]] if t.dim() > 1 else t
    j = index[-1]
    lo, hi = max(0, j - span), min(row.shape[0], j + span + 1)
    vals = ", ".join(f"{v:.6g}" for v in row[lo:hi].double().tolist())
    return f"[{lo}:{hi}] = [{vals}]"


def assert_close(
    actual: Tensor,
    expected: Tensor,
    *,
    what: str,
    atol: float = 1e-9,
    rtol: float = 1e-9,
    params: Mapping[str, Any] | None = None,
) -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` elementwise, shapes equal.

    Both are compared in float64 on the CPU. ``what`` names the quantity (e.g. "logits of chunk 2").
    """
    if not isinstance(actual, Tensor):
        _fail(f"{what}: expected a tensor, got {type(actual).__name__}", [], params)
    if tuple(actual.shape) != tuple(expected.shape):
        _fail(
            f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}",
            [f"  dtypes: actual {actual.dtype}, expected {expected.dtype}"],
            params,
        )
    a, e = actual.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    bad = ~((a - e).abs() <= atol + rtol * e.abs())
    bad |= a.isnan() != e.isnan()
    if not bool(bad.any()):
        return
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    err = (a - e).abs().nan_to_num(float("inf"))
    _fail(
        f"{what}: {int(bad.sum())} of {bad.numel()} elements differ beyond atol={atol:g}, rtol={rtol:g}",
        [
            f"  shape {tuple(a.shape)}, dtypes actual {actual.dtype} / expected {expected.dtype}",
            f"  max abs error {err.max().item():.3e} at {tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))}",
            f"  first differing position {first}: actual {a[first].item():.17g}, expected {e[first].item():.17g}",
            f"  actual   {_neighbourhood(a, first)}",
            f"  expected {_neighbourhood(e, first)}",
        ],
        params,
    )


def assert_logits_agree(
    actual: Tensor,
    expected: Tensor,
    *,
    dtype: torch.dtype,
    what: str,
    params: Mapping[str, Any] | None = None,
    exact: float = 1e-9,
    top_k: int = 5,
) -> None:
    """Logits ``[..., V]`` agree: in float64 by the three tiers of :mod:`infer_ref.conformance.tiers`
    (within ``exact``: passes; within the float32-intermediates tolerance: passes with a precision
    note, fails under ``--strict-float64``; beyond: fails); in lower precision by the golden files'
    teacher-forced, tie-aware rule for that dtype — at every position the expected top token's
    logprob is within ``eps`` of our best, and the expected top-k logprobs within ``topk_atol``
    (``infer_ref.conformance.oracles.golden.TOLERANCES``)."""
    if dtype == torch.float64:
        _assert_float64_tier(actual, expected, what=what, params=params, exact=exact)
        return
    from infer_ref.conformance.oracles.golden import tolerance_for

    if tuple(actual.shape) != tuple(expected.shape):
        _fail(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}", [], params)
    tol = tolerance_for(str(dtype).removeprefix("torch."))
    ours = torch.log_softmax(actual.detach().to("cpu", torch.float64), dim=-1)
    theirs = torch.log_softmax(expected.detach().to("cpu", torch.float64), dim=-1)
    top = theirs.topk(min(top_k, theirs.shape[-1]), dim=-1).indices  # [..., k]
    deficit = ours.max(dim=-1).values - ours.gather(-1, top[..., :1]).squeeze(-1)  # [...]
    delta = (ours.gather(-1, top) - theirs.gather(-1, top)).abs().max(dim=-1).values  # [...]
    bad = (deficit > tol.eps) | (delta > tol.topk_atol) | ours.isnan().any(dim=-1)
    if not bool(bad.any()):
        return
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    _fail(
        f"{what}: {int(bad.sum())} of {bad.numel()} positions outside the {dtype} tolerance "
        f"(eps {tol.eps}, top-k atol {tol.topk_atol})",
        [
            f"  first position {first}: expected top token {int(top[first][0])} is {float(deficit[first]):.4g} below our best "
            f"(our top token {int(ours[first].argmax())}); worst top-{top.shape[-1]} |Δlogprob| {float(delta[first]):.4g}",
            f"  max deficit {float(deficit.max()):.4g}, max top-k |Δlogprob| {float(delta.max()):.4g}",
        ],
        params,
    )


def _assert_float64_tier(actual: Tensor, expected: Tensor, *, what: str, params: Mapping[str, Any] | None, exact: float) -> None:
    """The float64 verdict of one comparison (see :func:`assert_logits_agree`)."""
    if not isinstance(actual, Tensor) or tuple(actual.shape) != tuple(expected.shape):
        assert_close(actual, expected, what=what, atol=exact, rtol=exact, params=params)
        return
    distance = tiers.needed_tolerance(actual, expected)
    verdict = tiers.float64_verdict(distance, exact)
    if verdict == tiers.EXACT:
        return
    if verdict == tiers.FLOAT32_STEPS and not tiers.strict_float64():
        tiers.PRECISION_NOTES.append(
            f"{what}: {tiers.FLOAT32_STEPS} ({distance:.1e} from the float64 oracle: beyond the exact tier's "
            f"{exact:g}, within the {tiers.FLOAT32_INTERMEDIATES:g} that float32 norms, RoPE angles or softmax explain)"
        )
        return
    why = (
        f"{tiers.FLOAT32_STEPS}, failed because --strict-float64 was given"
        if verdict == tiers.FLOAT32_STEPS
        else f"{tiers.WRONG}: beyond the {tiers.FLOAT32_INTERMEDIATES:g} that float32 intermediates explain"
    )
    assert_close(actual, expected, what=f"{what} [{why}]", atol=exact, rtol=exact, params=params)


def assert_equal(actual: Tensor, expected: Tensor, *, what: str, params: Mapping[str, Any] | None = None) -> None:
    """Bitwise equality (same shape, same dtype, same values): for data a cache merely stores."""
    if isinstance(actual, Tensor) and actual.dtype != expected.dtype:
        _fail(f"{what}: dtype {actual.dtype} != expected {expected.dtype}", [], params)
    assert_close(actual, expected, what=what, atol=0.0, rtol=0.0, params=params)


def assert_visibility(
    actual: Tensor, expected: Tensor, *, q_len: int, start: int, window: int | None, params: Mapping[str, Any] | None = None
) -> None:
    """Two bool ``[q_len, start+q_len]`` visibility tables are equal; on failure name the first
    (query, key) pair that differs and list the keys that query sees in each."""
    if tuple(actual.shape) != tuple(expected.shape):
        _fail(
            f"attention mask shape {tuple(actual.shape)} != expected {tuple(expected.shape)} "
            f"(q_len={q_len}, start={start}, window={window})",
            [],
            params,
        )
    diff = actual != expected
    if not bool(diff.any()):
        return
    i, j = (int(x) for x in diff.nonzero()[0].tolist())
    seen = [int(x) for x in actual[i].nonzero().flatten().tolist()]
    want = [int(x) for x in expected[i].nonzero().flatten().tolist()]
    _fail(
        f"attention mask: query {i} (position {start + i}) {'sees' if actual[i, j] else 'misses'} key {j}; "
        f"q_len={q_len}, start={start}, window={window}",
        [
            f"  query {i} sees keys    {seen}",
            f"  it should see keys     {want}",
            f"  {int(diff.sum())} (query, key) pairs differ in total",
        ],
        params,
    )


def assert_tokens_equal(
    actual: Sequence[int], expected: Sequence[int], *, what: str, params: Mapping[str, Any] | None = None
) -> None:
    """Two token sequences are equal; on failure give the first differing step."""
    actual, expected = list(actual), list(expected)
    if actual == expected:
        return
    n = next((i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b), min(len(actual), len(expected)))
    _fail(
        f"{what}: tokens differ at step {n}",
        [
            f"  actual   ({len(actual)} tokens) {actual}",
            f"  expected ({len(expected)} tokens) {expected}",
            f"  at step {n}: actual {actual[n] if n < len(actual) else '<end>'}, "
            f"expected {expected[n] if n < len(expected) else '<end>'}",
        ],
        params,
    )


NOTES: list[str] = []
"""Observations that are reported, not failed (e.g. an error message that does not name the value)."""


def note(message: str) -> None:
    """Record an observation for the conformance report (the plugin attaches it to the running test)."""
    NOTES.append(message)


def fail(message: str, *, params: Mapping[str, Any] | None = None, details: Sequence[str] = ()) -> None:
    """Fail with the same report layout (for checks that are not tensor comparisons)."""
    _fail(message, list(details), params)


__all__ = [
    "assert_close",
    "assert_equal",
    "assert_logits_agree",
    "assert_tokens_equal",
    "assert_visibility",
    "fail",
    "note",
    "repro_command",
    "set_run_context",
]
