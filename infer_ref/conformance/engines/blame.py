"""Blame in the engine tier: which one bug class best explains which tests failed and which passed.

An engine is a black box: the tier cannot probe inside it as the in-process tier does
(:mod:`infer_ref.conformance.blame`). What it has is the pattern of its own tests, each of which
sends requests a known way — on the *stressed* start (prefix caching, chunked prefill, a KV budget
small enough to preempt), on the *plain* one (none of those), warm against cold, in a batch against
alone, seeded under preemption. A bug shows only where its mechanism is reached, so each class has a
*profile* (:data:`PROFILES`): for every test, how likely one bug of the class is to fail it —
``ALWAYS`` (the test is built for it), ``OFTEN`` (it reaches the mechanism with some requests),
``RARELY``, and, for every test not named, ``NEVER`` (its requests never reach the mechanism).

Assuming one bug, each class the engine can exhibit is scored by how likely the observed outcomes
are under it (the product, over the tests judged on each checkpoint, of the chance of the outcome
seen); the most likely class is named, with the tests that decided it. A class whose needed
capabilities the engine lacks (transformers' ``generate`` has no KV budget, so nothing preempts) is
never a candidate and never "passed": it is reported as *cannot exhibit*, with what it lacks.

Plain functions over the report's :class:`~infer_ref.conformance.report.Observed` records, so they
are tested without an engine (``tests/engines/test_engine_blame.py``).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infer_ref.conformance.engines.failures import failure_lines, repro_command, script_of
from infer_ref.conformance.report import Observed, Report

ALWAYS, OFTEN, RARELY, NEVER = 0.9, 0.5, 0.15, 0.01  # chance one bug of a class fails a test
MOST_LIKELY, AS_LIKELY, LESS_LIKELY = "most likely", "as likely", "less likely"

# The tier's tests, by what their requests reach (the default workload, then the long-context one).
GENERATED = (
    "test_generated_logprobs_agree_with_oracle"  # stressed start: prefix hits, chunks, preemption, a batch
)
PROMPT = "test_prompt_logprobs_agree_with_oracle"  # the same, prompt positions too
CONVERSATION = "test_continued_conversation_agrees_with_oracle"  # warm: continued turns over a prefix hit
CONVERSATION_COLD = "test_continued_conversation_matches_cold"  # warm against an emptied prefix cache
SEED_REPEATS = "test_seeded_request_repeats"  # one seeded request twice
SEED_BATCH = "test_seeded_request_same_in_batch"  # seeded rows of a batch against alone
SEED_PREEMPTED = "test_seeded_requests_same_under_preemption_and_arrival_order"  # under a preempting budget
TOP_K = "test_top_logprobs_count_order_and_chosen"  # the API's top-k lists
PROMPT_ALIGNED = "test_prompt_logprobs_aligned"  # prompt logprobs at the right positions
BATCH = (
    "test_batch_matches_alone"  # a batch on the stressed start against each request alone on the plain one
)
PERMUTED = "test_permuted_order_matches"  # the same requests in reverse order (later ones hit the cache)
WARM = "test_warm_prefix_cache_matches_cold"  # extending prompts warm against cold
PREFIX_COUNTS = "test_prefix_cache_serves_the_shared_prefix"  # the cached-token counts
CHUNKED = "test_chunked_prefill_matches_whole"  # a prompt prefilled in chunks against whole
MAX_TOKENS = "test_max_tokens_exact"
EOS = "test_eos_ends_generation"
STOP = "test_stop_string_cut_at_earliest"
LONG = "test_long_prompts_agree_with_oracle"
LONG_BATCH = "test_long_batch_matches_alone"
LONG_CHUNKED = "test_long_chunked_prefill_matches_whole"
POOL_BOUNDARY = "test_pool_exhausted_at_block_boundary"
BLOCK_SIZE = "test_block_size_matches"
LONG_CONVERSATION = "test_long_continued_conversation_agrees_with_oracle"
LONG_PREFIX_COUNTS = "test_long_prefix_cache_serves_the_cached_turn"
LONG_CONVERSATION_COLD = "test_long_continued_conversation_matches_cold"
RECIPE = "test_recipe_statistics_within_calibrated_spread"
RECIPE_LONG = "test_recipe_statistics_at_long_distances"


@dataclass(frozen=True)
class Profile:
    """Where one bug of a class shows: ``where`` in words, the capabilities an engine needs to have
    it at all (``needs``), each test's chance of failing (``fails``; a test not named: ``NEVER``),
    and whether it shows only on checkpoints with sliding-window layers (``windowed``)."""

    where: str
    fails: Mapping[str, float]
    needs: tuple[str, ...] = ()
    windowed: bool = False

    def chance(self, test: str, family: str | None) -> float:
        if self.windowed and family is not None and without_windows(family):
            return NEVER
        return self.fails.get(test, NEVER)


_ORACLE_ALL = {GENERATED: OFTEN, PROMPT: OFTEN, CONVERSATION: OFTEN, LONG: OFTEN, LONG_CONVERSATION: OFTEN}
_CHUNKS = {
    CHUNKED: ALWAYS,
    LONG_CHUNKED: ALWAYS,
    **_ORACLE_ALL,
    BATCH: OFTEN,
    PERMUTED: OFTEN,
    WARM: OFTEN,
    CONVERSATION_COLD: OFTEN,
    SEED_BATCH: OFTEN,  # seeded prompts past the chunk budget, on the stressed start
    SEED_PREEMPTED: OFTEN,
    STOP: RARELY,
}
_CHUNKS_WHERE = "only prompts prefilled in chunks (the chunked-prefill budget of the stressed start)"

PROFILES: dict[str, Profile] = {
    "logprobs shifted by one position": Profile(
        "every request, every engine start alike: the oracle tests fail and the self-consistency ones "
        "(the engine against itself) pass",
        {
            GENERATED: ALWAYS,
            PROMPT: ALWAYS,
            CONVERSATION: ALWAYS,
            LONG: ALWAYS,
            LONG_CONVERSATION: ALWAYS,
            TOP_K: OFTEN,
            PROMPT_ALIGNED: OFTEN,
        },
    ),
    "prompt logprobs of cached prefix positions stale or zero": Profile(
        "only prompt positions served from the prefix cache; generated steps agree",
        {PROMPT: ALWAYS, PERMUTED: OFTEN, PROMPT_ALIGNED: RARELY},
        needs=("prompt_logprobs", "prefix_caching"),
    ),
    "stop string cut at the last occurrence": Profile(
        "only where a stop string ends generation", {STOP: ALWAYS}, needs=("stop_strings",)
    ),
    "max_tokens off by one": Profile("only the number of tokens generated", {MAX_TOKENS: ALWAYS}),
    "batch row samples with its neighbour's seed": Profile(
        "only seeded sampled requests sent in a batch",
        {SEED_BATCH: ALWAYS, SEED_PREEMPTED: OFTEN},
        needs=("batch", "seed"),
    ),
    "prefix hit reuses another prompt's block": Profile(
        "only requests served a prefix hit: warm differs from cold",
        {
            **_ORACLE_ALL,
            WARM: ALWAYS,
            CONVERSATION_COLD: OFTEN,
            BATCH: OFTEN,
            PERMUTED: OFTEN,
            SEED_PREEMPTED: RARELY,
            LONG_CONVERSATION_COLD: OFTEN,
            BLOCK_SIZE: OFTEN,
        },
        needs=("prefix_caching",),
    ),
    "top-k list unsorted or missing the chosen token": Profile(
        "only the top-k lists; every logprob agrees with the oracle", {TOP_K: ALWAYS}, needs=("top_logprobs",)
    ),
    "preemption resumes from a stale position": Profile(
        "only after a preemption (the stressed start's KV budget); the plain start and seeded requests "
        "alone agree",
        {
            **_ORACLE_ALL,
            SEED_PREEMPTED: ALWAYS,
            BATCH: OFTEN,
            PERMUTED: OFTEN,
            WARM: OFTEN,
            CONVERSATION_COLD: RARELY,
            LONG_BATCH: OFTEN,
            POOL_BOUNDARY: ALWAYS,
        },
        needs=("kv_budget",),
    ),
    "seeded tokens change when the request is preempted": Profile(
        "only seeded sampled requests that are preempted; greedy answers and logprobs agree",
        {SEED_PREEMPTED: ALWAYS},
        needs=("kv_budget", "seed"),
    ),
    "prefix cache stops hitting past the first block": Profile(
        "only the cached-token counts; every answer agrees",
        {PREFIX_COUNTS: ALWAYS, LONG_PREFIX_COUNTS: ALWAYS},
        needs=("prefix_caching", "cached_tokens"),
    ),
    "prompt chunk positions restart at 0": Profile(_CHUNKS_WHERE, _CHUNKS, needs=("chunked_prefill",)),
    "prompt chunk sees the cache past its sliding window": Profile(
        _CHUNKS_WHERE + ", on checkpoints with sliding-window layers",
        _CHUNKS,
        needs=("chunked_prefill",),
        windowed=True,
    ),
    "prompt chunk K/V not written": Profile(_CHUNKS_WHERE, _CHUNKS, needs=("chunked_prefill",)),
    "batch row reads a neighbour's cache": Profile(
        "only requests in a batch",
        {BATCH: ALWAYS, LONG_BATCH: ALWAYS, **_ORACLE_ALL, SEED_BATCH: OFTEN, SEED_PREEMPTED: OFTEN},
        needs=("batch",),
    ),
    "causal mask top-left aligned for T>1 over a cache": Profile(
        "only a prompt computed over cached positions (a continued turn, a chunk)",
        {
            CONVERSATION: ALWAYS,
            LONG_CONVERSATION: ALWAYS,
            CHUNKED: ALWAYS,
            LONG_CHUNKED: ALWAYS,
            GENERATED: OFTEN,
            PROMPT: OFTEN,
            CONVERSATION_COLD: OFTEN,
            WARM: OFTEN,
            PERMUTED: OFTEN,
        },
    ),
    "seeded sampling not reproducible": Profile(
        "seeded sampled requests, even alone",
        {SEED_REPEATS: ALWAYS, SEED_BATCH: OFTEN, SEED_PREEMPTED: OFTEN},
        needs=("seed",),
    ),
    "seeded tokens depend on preemption or the batch": Profile(
        "only seeded sampled requests under preemption or in a batch",
        {SEED_PREEMPTED: ALWAYS, SEED_BATCH: RARELY},
        needs=("seed", "batch"),  # preemption too needs requests that compete for the KV cache
    ),
    "EOS ignored or only partly honoured": Profile("only where an EOS ends generation", {EOS: ALWAYS}),
    "window off-by-one": Profile(
        "only past a sliding window",
        {LONG: ALWAYS, LONG_CONVERSATION: OFTEN, **{t: RARELY for t in (GENERATED, PROMPT)}},
        windowed=True,
    ),
    "llama3 rope scaling ignored": Profile(
        "only on Llama 3 checkpoints with RoPE scaling, at long positions",
        {LONG: ALWAYS, LONG_CONVERSATION: OFTEN},
    ),
    "decode slot off by one in the block table": Profile(
        "only at block boundaries",
        {BLOCK_SIZE: ALWAYS, **_ORACLE_ALL, LONG_BATCH: OFTEN},
        needs=("block_size",),
    ),
    "block table entries truncated to a narrow integer": Profile(
        "only past 256 KV blocks (the long-context workload)",
        {
            LONG: ALWAYS,
            LONG_BATCH: OFTEN,
            LONG_CONVERSATION: OFTEN,
            LONG_CONVERSATION_COLD: OFTEN,
            POOL_BOUNDARY: OFTEN,
        },
    ),
    "RoPE positions past a precomputed table clamped": Profile(
        "only past position 8192 (the long-context workload)", {LONG: ALWAYS, LONG_CONVERSATION: OFTEN}
    ),
    "RMSNorm accumulated or scaled in low precision": Profile(
        "only in bfloat16/float16, in the signed statistics", {RECIPE: ALWAYS}, needs=("prompt_logprobs",)
    ),
    "Gemma's 1 + w formed in low precision": Profile(
        "only in bfloat16/float16, on Gemma's norms", {RECIPE: ALWAYS}, needs=("prompt_logprobs",)
    ),
    "RoPE frequencies or angles held in low precision": Profile(
        "only in bfloat16/float16, at long distances", {RECIPE_LONG: ALWAYS}, needs=("prompt_logprobs",)
    ),
    "attention softmax sum accumulated in low precision": Profile(
        "only in bfloat16/float16, behind an attention sink (or at long distances in float16)",
        {RECIPE: ALWAYS, RECIPE_LONG: OFTEN},
        needs=("prompt_logprobs",),
    ),
    "residual stream truncated by a fused add + norm": Profile(
        "only in bfloat16/float16, in the signed statistics", {RECIPE: ALWAYS}, needs=("prompt_logprobs",)
    ),
    "embed scale not rounded to dtype": Profile(
        "only in float16, on a Gemma checkpoint whose sqrt(hidden) is inexact (Gemma's normaliser "
        "rounded to bfloat16)",
        {RECIPE: ALWAYS},
        needs=("prompt_logprobs",),
    ),
}


def without_windows(family: str) -> bool:
    """Whether a checkpoint folder's name says a family with no sliding-window layers (the kit's Llama
    and Qwen 3 checkpoints); a name that says neither is not known to lack them."""
    return family.lower().startswith(("llama", "qwen"))


def test_name(nodeid: str) -> str:
    """``test_x`` of ``test_file.py::test_x[llama-tiny-2]``."""
    return nodeid.partition("::")[2].partition("[")[0]


@dataclass(frozen=True)
class Judged:
    """One test on one checkpoint, judged: failed in any of its cases, or passed in all."""

    test: str
    family: str | None
    failed: bool


def judged_tests(observed: Sequence[Observed]) -> list[Judged]:
    """The passed and failed tests, one per test and checkpoint (a test's cases of one checkpoint,
    such as max_tokens 1, 2 and 7, are one piece of evidence); refusals (the engine raised) and
    tests not judged or not supported are no evidence."""
    outcome: dict[tuple[str, str | None], bool] = OrderedDict()
    for o in observed:
        if o.outcome not in ("passed", "failed") or o.refusal:
            continue
        key = (test_name(o.nodeid), o.family)
        outcome[key] = outcome.get(key, False) or o.outcome == "failed"
    return [Judged(test, family, failed) for (test, family), failed in outcome.items()]


def log_likelihood(profile: Profile, judged: Sequence[Judged]) -> float:
    """log P(the outcomes | one bug of the class)."""
    total = 0.0
    for j in judged:
        p = profile.chance(j.test, j.family)
        total += math.log(p if j.failed else 1.0 - p)
    return total


def lacking(profile: Profile, capabilities: frozenset[str] | None) -> list[str]:
    """The capabilities the class needs that the engine lacks (none where they are not known)."""
    return [] if capabilities is None else [c for c in profile.needs if c not in capabilities]


@dataclass
class Blame:
    """The engine tier's blame: the named class and why, the others ranked, what cannot be exhibited."""

    most_likely: str = ""
    why: str = ""
    others: dict[str, tuple[str, str]] = field(
        default_factory=OrderedDict
    )  # class -> (AS_LIKELY/LESS_LIKELY, why)
    cannot_exhibit: dict[str, str] = field(default_factory=OrderedDict)  # class -> the capabilities it lacks


def narrow(
    judged: Sequence[Judged], capabilities: frozenset[str] | None, profiles: Mapping[str, Profile] = PROFILES
) -> Blame:
    """The most likely class of one bug given ``judged`` (nothing named when no test failed)."""
    blame = Blame()
    exhibitable = {}
    for name, profile in profiles.items():
        if missing := lacking(profile, capabilities):
            blame.cannot_exhibit[name] = ", ".join(missing)
        else:
            exhibitable[name] = profile
    failed = [j for j in judged if j.failed]
    if not failed or not exhibitable:
        return blame
    scores = {name: log_likelihood(p, judged) for name, p in exhibitable.items()}
    ranked = sorted(scores, key=lambda n: -scores[n])
    best = ranked[0]
    tied = [n for n in ranked[1:] if math.isclose(scores[n], scores[best], rel_tol=1e-9)]
    blame.most_likely = best
    blame.why = why_named(exhibitable[best], judged, [exhibitable[n] for n in ranked[1:3] if n not in tied])
    if tied:
        blame.why += f"; not separated by the tier's tests from: {', '.join(tied)}"
    for name in tied:
        blame.others[name] = (AS_LIKELY, "the tier's tests do not separate it from the class named")
    for name in ranked[1:]:
        if name not in tied and any(exhibitable[name].chance(j.test, j.family) > NEVER for j in failed):
            blame.others[name] = (LESS_LIKELY, why_less_likely(exhibitable[name], exhibitable[best], judged))
    return blame


def _short(test: str) -> str:
    return test.removeprefix("test_")


def _families(judged: Sequence[Judged]) -> str:
    names = sorted({j.family for j in judged if j.failed and j.family})
    return f" on {', '.join(names)}" if names else ""


def why_named(profile: Profile, judged: Sequence[Judged], runners_up: Sequence[Profile]) -> str:
    """``where``; the failed tests; the passed tests that set it apart from the runners-up."""
    failed = list(dict.fromkeys(_short(j.test) for j in judged if j.failed))
    separating = [
        j
        for j in judged
        if not j.failed
        and any(r.chance(j.test, j.family) >= OFTEN > profile.chance(j.test, j.family) for r in runners_up)
    ]
    passed = list(dict.fromkeys(_short(j.test) for j in separating))
    text = f"{profile.where}; failed{_families(judged)}: {', '.join(failed)}"
    return text + (f"; passed: {', '.join(passed[:4])}" if passed else "")


def why_less_likely(profile: Profile, best: Profile, judged: Sequence[Judged]) -> str:
    """The outcome that counts most against ``profile`` beside the named class's ``best``."""

    def against(j: Judged) -> float:
        p, q = profile.chance(j.test, j.family), best.chance(j.test, j.family)
        return math.log(q if j.failed else 1 - q) - math.log(p if j.failed else 1 - p)

    j = max(judged, key=against)
    return f"`{_short(j.test)}` {'failed' if j.failed else 'passed'}, which its bugs {_how_often(profile.chance(j.test, j.family))} fail"


def _how_often(chance: float) -> str:
    if chance >= ALWAYS:
        return "always"
    if chance >= OFTEN:
        return "often"
    return "rarely" if chance > NEVER else "never"


def engine_capabilities(report: Report, observed: Sequence[Observed]) -> frozenset[str] | None:
    """What the engine declared (the report's capabilities, from the run's ledger), else what its
    tests show: a capability of a test that ran, not one a "not supported" skip names; None: unknown."""
    if report.capabilities:
        return frozenset(c for c, why in report.capabilities.items() if why is None)
    ran = {c for o in observed if o.outcome in ("passed", "failed") for c in o.capabilities}
    missing = {c for o in observed if o.outcome == "not supported" for c in _named_in_skip(o.text)}
    return frozenset(ran - missing) if ran or missing else None


def _named_in_skip(reason: str) -> list[str]:
    """``not supported by NAME (batch, kv_budget)`` -> the capabilities named."""
    found = re.search(r"\(([a-z_, ]+)(?::[^)]*)?\)\s*$", reason)
    return [c.strip() for c in found.group(1).split(",")] if found else []


def blame_report(report: Report, observed: Sequence[Observed]) -> None:
    """Fill the engine tier's blame into ``report`` (the Collector calls it before the report is
    written): the named class, the others, the classes it cannot exhibit (their rows leave the
    bug-class table: nothing of them was judged), one line per failure and the repro command."""
    blame = narrow(judged_tests(observed), engine_capabilities(report, observed))
    report.most_likely, report.most_likely_why = blame.most_likely, blame.why
    report.blame = OrderedDict(
        (c, {"verdict": verdict, "why": why}) for c, (verdict, why) in blame.others.items()
    )
    if blame.most_likely:
        report.blame = OrderedDict(
            [(blame.most_likely, {"verdict": MOST_LIKELY, "why": blame.why}), *report.blame.items()]
        )
    report.cannot_exhibit = blame.cannot_exhibit
    for name in blame.cannot_exhibit:
        report.by_bug_class.pop(name, None)
    failed = [o for o in observed if o.outcome == "failed"]
    report.failures = failure_lines(failed)
    if failed:
        telling = most_telling(failed, PROFILES.get(blame.most_likely))
        report.repro, report.repro_script = repro_command(telling, report.impl), script_of(telling.text) or ""


def most_telling(failed: Sequence[Observed], profile: Profile | None) -> Observed:
    """The failure a developer reruns first: the one the named class fails most surely (the test
    built for it), else the first."""
    if profile is None:
        return failed[0]
    return max(failed, key=lambda o: profile.chance(test_name(o.nodeid), o.family))


__all__ = ["PROFILES", "Blame", "Judged", "Profile", "blame_report", "judged_tests", "narrow"]
