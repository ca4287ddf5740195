"""Failures blamed on their cause: the bug classes the evidence supports, the rest not implicated.

A failed conformance test guards several bug classes (``Guards: *...*`` in its docstring); a report
that listed them all would blame a norm's rounding on "V rotated by RoPE". After a run with failures,
the report narrows them:

1. The *candidates* are the classes guarded by a failed test (refusals excluded). A class no probe
   can see (a cache's, the scheduler's, the sampler's) is not implicated when a test that checks it
   alone passed in every case, or when a failed test checks another class alone and every failed
   test that guards it guards that other class too (one bug of the other class explains every
   failure; one of this class cannot fail that test); a class of one family's feature (Gemma's
   1 + w) is not implicated when a test case of a family without that feature failed.
2. If a candidate can show in a model run, the follow-up probes run (:mod:`.suite`) on the families
   whose tests failed, and each candidate is checked against their outcomes with the table of
   :mod:`.signatures`, assuming one bug: a candidate is *not implicated* when a probe it always
   fails passed, or a probe it can never fail failed.
3. A surviving candidate is *implicated* when a failed probe is one it always fails, or when it is
   the only surviving class of some failed test; otherwise it stays *possible* (the evidence does
   not separate it from another survivor).

When every candidate is ruled out and no probe failed, what failed is none of the classes (a
rounding difference failed under ``--strict-float64``, say) and the report says so. When no
candidate survives although probes failed, one bug does not explain the outcomes (several bugs, or one outside the
catalogue): only the sound half is kept — a candidate is ruled out only by a probe it always fails
that passed — and the report says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from infer_ref.conformance.blame.probes import ProbeResult
from infer_ref.conformance.blame.signatures import SIGNATURES, family_feature
from infer_ref.conformance.checkpoints.snapshots import FAMILIES

IMPLICATED, POSSIBLE, NOT_IMPLICATED = "implicated", "possible", "not implicated"
NO_SINGLE_CLASS = (
    "no single bug class explains the probes' outcomes (several bugs, or one outside the catalogue): "
    "only classes ruled out by a passing probe are marked not implicated"
)
NO_PROBE_FAILS = (
    "every follow-up probe passes, and each candidate class would fail one: what failed is none of them "
    "(under --strict-float64, a rounding difference the precision notes describe)"
)


@dataclass(frozen=True)
class Finding:
    verdict: str  # IMPLICATED | POSSIBLE | NOT_IMPLICATED
    why: str


def probe_families(failed_tests: Mapping[str, Sequence[str]], families: Sequence[str]) -> list[str]:
    """The families named in the failed tests' ids (``...[gemma3_text]``), or all of them when a
    failed test names none."""
    named = [f for f in families if any(f"[{f}" in node or f"-{f}" in node for node in failed_tests)]
    return named or list(families)


def needs_probes(candidates: Iterable[str]) -> bool:
    return any(c in SIGNATURES for c in candidates)


def _contradiction(cls: str, results: Sequence[ProbeResult], *, sound_only: bool) -> str | None:
    """Why one bug of ``cls`` cannot explain ``results``, or None."""
    signature = SIGNATURES.get(cls)
    if signature is None:
        return None
    probed = sorted({r.family for r in results if not r.error})
    if probed and not any(signature.applies(f) for f in probed):
        return f"the families whose tests failed ({', '.join(probed)}) have no {signature.feature}"
    for r in results:
        if r.error:
            continue
        sign = signature.sign(r.name, r.family, r.windowed)
        if sign == "always" and not r.failed:
            return f"probe '{r.name}' [{r.family}] {r.outcome}, and every bug of this class fails it"
        if sign == "never" and r.failed and not sound_only:
            return f"probe '{r.name}' [{r.family}] {r.outcome}, and no bug of this class can make it fail"
    return None


def _support(cls: str, results: Sequence[ProbeResult], failed_tests: Mapping[str, Sequence[str]], survivors: set[str]) -> str | None:
    signature = SIGNATURES.get(cls)
    if signature is not None:
        for r in results:
            if r.failed and not r.error and signature.sign(r.name, r.family, r.windowed) == "always":
                return f"probe '{r.name}' [{r.family}] {r.outcome}, as every bug of this class does; the other candidates are ruled out"
    for node, guarded in failed_tests.items():
        if cls in guarded and not (set(guarded) - {cls}) & survivors:
            return f"the only class left that `{node}` guards"
    return None


def _cleared_by_a_passing_test(cls: str, failed_tests: Mapping[str, Sequence[str]], passed_tests: Mapping[str, Sequence[str]]) -> str | None:
    """A class no probe can see is ruled out by a test that checks it alone and passed in every case."""
    if cls in SIGNATURES:
        return None  # model-level classes: a component test passing says nothing of the model (the probes do)
    failed_bases = {node.partition("[")[0] for node in failed_tests}
    for node, guarded in passed_tests.items():
        if list(guarded) == [cls] and node.partition("[")[0] not in failed_bases:
            return f"`{node}` checks this class alone and passes"
    return None


def _failed_outside_its_families(cls: str, failed_tests: Mapping[str, Sequence[str]]) -> str | None:
    """One bug of a class that concerns one family's feature (Gemma's 1 + w) cannot fail a test case
    of a family without it: such a failed case guarding the class rules it out."""
    feature = family_feature(cls)
    if feature is None:
        return None
    applies, name = feature
    for node, guarded in failed_tests.items():
        params = node.partition("[")[2].rstrip("]").split("-")
        families = [f for f in FAMILIES if f in params]
        if cls in guarded and families and not any(applies(f) for f in families):
            return f"`{node}` failed, and {families[0]} has no {name}"
    return None


def _explained_by_a_class_checked_alone(cls: str, failed_tests: Mapping[str, Sequence[str]], survivors: set[str]) -> str | None:
    """A class no probe can see is ruled out by a failed test that checks another class alone and
    does not guard it, when every failed test that guards it guards that other class too: one bug
    of the other class explains every failure, one of this class not that test's."""
    if cls in SIGNATURES:
        return None  # model-level classes: the probes judge them
    guarding = [set(guarded) for guarded in failed_tests.values() if cls in guarded]
    for node, guarded in failed_tests.items():
        if len(guarded) != 1 or guarded[0] == cls or guarded[0] not in survivors:
            continue
        other = guarded[0]
        if all(other in g for g in guarding):
            return f"`{node}` failed and checks {other} alone, which also explains every failed test that guards this class"
    return None


def narrow(
    failed_tests: Mapping[str, Sequence[str]], results: Sequence[ProbeResult], passed_tests: Mapping[str, Sequence[str]] | None = None
) -> tuple[dict[str, Finding], str | None]:
    """Each candidate's finding, and a note when one bug does not explain the outcomes.

    ``failed_tests`` / ``passed_tests``: node id -> the bug classes the test guards; ``results``: the
    probes that ran."""
    candidates = list(dict.fromkeys(c for guarded in failed_tests.values() for c in guarded))
    passed = passed_tests or {}
    ruled_out = {c: why for c in candidates if (why := _contradiction(c, results, sound_only=False))}
    ruled_out |= {c: why for c in candidates if c not in ruled_out and (why := _cleared_by_a_passing_test(c, failed_tests, passed))}
    ruled_out |= {c: why for c in candidates if c not in ruled_out and (why := _failed_outside_its_families(c, failed_tests))}
    left = {c for c in candidates if c not in ruled_out}
    ruled_out |= {c: why for c in candidates if c not in ruled_out and (why := _explained_by_a_class_checked_alone(c, failed_tests, left))}
    note = None
    if len(ruled_out) == len(candidates) and candidates:
        if not any(r.failed for r in results):
            return {c: Finding(NOT_IMPLICATED, why) for c, why in ruled_out.items()}, NO_PROBE_FAILS
        note = NO_SINGLE_CLASS
        ruled_out = {c: why for c in candidates if (why := _contradiction(c, results, sound_only=True))}
        ruled_out |= {c: why for c in candidates if c not in ruled_out and (why := _cleared_by_a_passing_test(c, failed_tests, passed))}
    survivors = {c for c in candidates if c not in ruled_out}
    findings: dict[str, Finding] = {}
    for c in candidates:
        if c in ruled_out:
            findings[c] = Finding(NOT_IMPLICATED, ruled_out[c])
        elif note is None and (why := _support(c, results, failed_tests, survivors)):
            findings[c] = Finding(IMPLICATED, why)
        else:
            findings[c] = Finding(POSSIBLE, "consistent with every outcome, not separated from " + (", ".join(sorted(survivors - {c})) or "nothing"))
    return findings, note


__all__ = ["IMPLICATED", "NOT_IMPLICATED", "POSSIBLE", "Finding", "narrow", "needs_probes", "probe_families"]
