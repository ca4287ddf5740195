"""The low-precision verdict's arithmetic (infer_ref.conformance.engines.verdicts.distribution), its threshold
table, and the seeded-token rule of bfloat16/float16, each against values stated here."""

from __future__ import annotations

import math

import pytest
import torch

from infer_ref.conformance.engines.protocol import EngineOutput, TokenLogprobs
from infer_ref.conformance.engines.verdicts.compare import seeded_tokens_differ
from infer_ref.conformance.engines.verdicts.distribution import (
    PositionStat,
    binned_kl,
    judge,
    position_stats,
    summarise,
)
from infer_ref.conformance.engines.verdicts.thresholds import JUDGED, load_table, thresholds_for


def _row(logits: list[float]) -> torch.Tensor:
    return torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=-1)


def _entry(row: torch.Tensor, ids: list[int], token: int | None = None) -> TokenLogprobs:
    chosen = ids[0] if token is None else token
    return TokenLogprobs(chosen, float(row[chosen]), tuple((i, float(row[i])) for i in ids))


def test_kl_over_every_token_is_the_full_kl() -> None:
    p, q = _row([2.0, 1.0, 0.5, -1.0, 0.0]), _row([1.5, 1.2, 0.1, -0.5, 0.3])
    full = float((p.exp() * (p - q)).sum())  # KL(p || q), the definition
    assert binned_kl(_entry(q, [0, 1, 2, 3, 4]), p) == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_kl_over_the_top_k_and_the_rest_never_exceeds_the_full_kl(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.log_softmax(torch.randn(50, generator=g, dtype=torch.float64), -1), torch.log_softmax(torch.randn(50, generator=g, dtype=torch.float64), -1)
    top = torch.argsort(q, descending=True)[:5].tolist()
    full = float((p.exp() * (p - q)).sum())
    # two bins: the top-5, the rest -- by hand
    ps, qs = p.exp()[top], q.exp()[top]
    by_hand = float((ps * (ps.log() - qs.log())).sum()) + (1 - float(ps.sum())) * math.log((1 - float(ps.sum())) / (1 - float(qs.sum())))
    assert binned_kl(_entry(q, top), p) == pytest.approx(by_hand, rel=1e-9)
    assert binned_kl(_entry(q, top), p) <= full + 1e-12


def test_kl_is_zero_when_the_engine_reports_the_oracle_s_own_logprobs() -> None:
    p = _row([0.3, 2.0, -1.0, 0.7])
    assert binned_kl(_entry(p, [1, 3]), p) == pytest.approx(0.0, abs=1e-15)


def test_engine_mass_above_one_leaves_a_finite_rest() -> None:
    p = _row([1.0, 0.0, -2.0])
    inflated = TokenLogprobs(0, 0.0, ((0, 0.0), (1, -0.1)))  # probabilities 1 and 0.9: no rest left
    assert math.isfinite(binned_kl(inflated, p)) and binned_kl(inflated, p) > 0


def test_position_stats_logprob_error_and_top_token() -> None:
    p = _row([0.0, 1.0, 3.0])
    entry = TokenLogprobs(1, float(p[1]) + 0.25, ((0, -0.1), (1, float(p[1]) + 0.25)))  # the engine's top is token 0
    stat = position_stats(0, "step 0", 7, entry, p)
    assert stat.logprob_error == pytest.approx(0.25) and not stat.same_top
    assert position_stats(0, "step 0", 7, _entry(p, [2, 1]), p).same_top


def _stats(kls: list[float], same: list[bool] | None = None) -> list[PositionStat]:
    same = same or [True] * len(kls)
    return [PositionStat(i, f"step {i}", 10, kl / 10, kl, s) for i, (kl, s) in enumerate(zip(kls, same, strict=True))]


def test_summary_statistics() -> None:
    s = summarise(_stats([float(i) for i in range(1, 101)], [i % 4 != 0 for i in range(100)]))
    assert (s.positions, s.kl_mean, s.kl_median, s.kl_p99, s.kl_max) == (100, 50.5, 50.0, 99.0, 100.0)
    assert s.same_top == 0.75 and s.logprob_error_max == pytest.approx(10.0)


def test_judge_names_the_statistic_and_its_worst_positions() -> None:
    stats = _stats([0.001] * 97 + [0.5, 0.9, 0.7], [True] * 98 + [False, True])
    _, exceeded = judge(stats, {"kl_mean": 1.0, "kl_p99": 0.1, "same_top": 0.995})
    assert [e.statistic for e in exceeded] == ["kl_p99", "same_top"]
    assert [p.request for p in exceeded[0].worst] == [98, 99, 97]  # the largest KLs first
    assert [p.request for p in exceeded[1].worst] == [98]  # the one position whose top token differs
    assert "kl_p99 0.7 is above its threshold 0.1" in str(exceeded[0])
    assert not judge(stats, {"kl_mean": 1.0})[1]


def test_nan_logprob_is_a_failure_not_a_pass() -> None:
    p = _row([0.0, 1.0])
    stat = position_stats(0, "step 0", 3, TokenLogprobs(1, float("nan"), ((1, float("nan")),)), p)
    assert stat.kl == math.inf and stat.logprob_error == math.inf
    assert [e.statistic for e in judge([stat], {"kl_mean": 1.0, "logprob_error_max": 1.0})[1]] == ["kl_mean", "logprob_error_max"]


def test_thresholds_for_calibrated_and_other_checkpoints() -> None:
    table = load_table()
    known = thresholds_for("bfloat16", "generated", "qwen3-tiny")
    assert known.values == table["thresholds"]["bfloat16"]["generated"]["qwen3-tiny"] and set(known.values) == set(JUDGED)
    other = thresholds_for("bfloat16", "generated", "my-own-model")
    rows = table["thresholds"]["bfloat16"]["generated"].values()
    assert other.values["kl_mean"] == max(r["kl_mean"] for r in rows) and other.values["same_top"] == min(r["same_top"] for r in rows)
    assert "not calibrated" in other.source
    with pytest.raises(ValueError, match="no low-precision thresholds for float32"):
        thresholds_for("float32", "generated", "qwen3-tiny")
    with pytest.raises(ValueError, match="kind must be one of generated, prompt"):
        thresholds_for("bfloat16", "steps", "qwen3-tiny")


def _answer(tokens: list[int], rows: list[tuple[tuple[int, float], ...]]) -> EngineOutput:
    steps = tuple(TokenLogprobs(t, dict(r).get(t, -9.0), r) for t, r in zip(tokens, rows, strict=True))
    return EngineOutput(tuple(tokens), "", steps, "length")


def test_seeded_tokens_in_float32_must_match() -> None:
    a = _answer([1, 2], [((1, -0.1),), ((2, -0.2),)])
    assert seeded_tokens_differ(a, a, exact=True) is None
    assert seeded_tokens_differ(a, _answer([1, 3], [((1, -0.1),), ((2, -0.2),)]), exact=True) is not None


def test_seeded_tokens_in_low_precision_may_part_only_where_the_distributions_differ() -> None:
    alone = _answer([1, 2, 4], [((1, -0.1),), ((2, -0.2),), ((4, -0.3),)])
    same_rows_other_token = _answer([1, 5, 4], [((1, -0.1),), ((2, -0.2),), ((4, -0.3),)])
    assert "same reported distribution" in (seeded_tokens_differ(alone, same_rows_other_token, exact=False) or "")
    rounded_then_parted = _answer([1, 5, 6], [((1, -0.1001),), ((2, -0.2),), ((4, -0.3),)])
    assert seeded_tokens_differ(alone, rounded_then_parted, exact=False) is None


def test_seeded_tokens_parting_without_top_logprobs_cannot_be_judged() -> None:
    """An engine that reports only its chosen token's logprob: where two runs part at once, nothing
    shows their distributions were the same, so rounding cannot be ruled out."""
    alone, other = _answer([1, 2], [(), ()]), _answer([3, 2], [(), ()])
    assert seeded_tokens_differ(alone, other, exact=False) is None
    assert seeded_tokens_differ(alone, other, exact=True) is not None


def test_power_table_counts_what_float32_catches() -> None:
    """Two planted bugs caught in float32, one of them in bfloat16, a third caught only in bfloat16:
    bfloat16 catches 1 of the 2 float32 catches (50%) and 1 float32 cannot see; the control's
    failure is a false alarm, never a catch."""
    from infer_ref.conformance.engines import power

    a, b, c = (p.name for p in power.PLANTED[1:4])
    runs = [
        {"engine": power.CONTROL, "dtype": "float32", "failed": [], "distributions": []},
        {"engine": power.CONTROL, "dtype": "bfloat16", "failed": ["test_x[llama-tiny]"], "distributions": []},
        {"engine": a, "dtype": "float32", "failed": ["test_x[llama-tiny]"], "distributions": []},
        {"engine": a, "dtype": "bfloat16", "failed": ["test_x[llama-tiny]"], "distributions": []},
        {"engine": b, "dtype": "float32", "failed": ["test_y[llama-tiny]"], "distributions": []},
        {"engine": b, "dtype": "bfloat16", "failed": [], "distributions": []},
        {"engine": c, "dtype": "float32", "failed": [], "distributions": []},
        {"engine": c, "dtype": "bfloat16", "failed": ["test_z[qwen3-tiny]"], "distributions": []},
    ]
    text = power.markdown(runs)
    assert f"- bfloat16: catches 1 of the 2 bugs float32 catches (50%), and 1 float32 cannot see ({c})." in text
    assert "**false alarm**: test_x[llama-tiny]" in text


def test_a_missed_bugs_nearest_statistic_skips_rows_judged_by_recipe_spreads() -> None:
    """The recipe verdict's rows carry no distribution thresholds (they are judged in spreads): the
    power table's nearest miss is read from the threshold rows alone, 0.5 x here."""
    from infer_ref.conformance.engines import power

    stats = {"kl_mean": 1e-4, "kl_p99": 1e-3, "logprob_error_max": 0.1, "same_top": 1.0}
    judged = {**stats, "checkpoint": "llama-tiny", "thresholds": {**stats, "kl_mean": 2e-4, "kl_p99": 1e-2, "logprob_error_max": 1.0}}
    recipe = {**stats, "checkpoint": "llama3-numerics-rms-anchor-t5", "thresholds": {}}
    run = {"engine": "x", "dtype": "bfloat16", "failed": [], "distributions": [recipe, judged]}
    assert power.closest_miss(run) == "kl_mean 0.0001 = 0.50 x its threshold on llama-tiny"


def test_a_missed_bugs_line_gives_its_largest_recipe_deviation_in_spreads() -> None:
    """Beside the nearest threshold, the judged recipe statistic furthest from the centre (by |spreads|,
    sign kept): -2.4 beats +1.1; an unjudged statistic (no spread measured) is passed over however large."""
    from infer_ref.conformance.engines import power

    stats = {"kl_mean": 1e-4, "kl_p99": 1e-3, "logprob_error_max": 0.1, "same_top": 1.0}
    judged = {**stats, "checkpoint": "llama-tiny", "thresholds": {**stats, "kl_mean": 2e-4, "kl_p99": 1e-2, "logprob_error_max": 1.0}}
    recipe = {**stats, "checkpoint": "llama3-numerics-rms-anchor-t5", "thresholds": {}, "recipe_statistics": {
        "slope": {"spreads": 1.1, "t": 4.0, "judged": True},
        "chosen_error": {"spreads": -2.4, "t": -7.3, "judged": True},
        "kl_trend": {"spreads": 9.0, "t": 9.0, "judged": False},
    }}  # fmt: skip
    run = {"engine": "x", "dtype": "bfloat16", "failed": [], "distributions": [recipe, judged]}
    assert power.closest_miss(run) == (
        "kl_mean 0.0001 = 0.50 x its threshold on llama-tiny; "
        "recipe chosen_error -2.4 spreads (t -7.3) on llama3-numerics-rms-anchor-t5"
    )
    assert power.largest_recipe_deviation({"distributions": [judged]}) == ""


def test_power_runs_merge_with_the_later_run_standing() -> None:
    from infer_ref.conformance.engines import power

    old = [{"engine": "a", "dtype": "float32", "failed": []}, {"engine": "b", "dtype": "float32", "failed": []}]
    new = [{"engine": "a", "dtype": "float32", "failed": ["test_x"]}, {"engine": "a", "dtype": "float16", "failed": []}]
    runs = power.merged([old, new])
    assert [(r["engine"], r["dtype"], r["failed"]) for r in runs] == [
        ("b", "float32", []), ("a", "float32", ["test_x"]), ("a", "float16", [])
    ]


def test_power_table_leaves_a_correct_recipe_neither_caught_nor_missed() -> None:
    """A planted change that is the canonical recipe in a dtype shows "—" there (why, under the table),
    and fails a correct recipe there when a test fails on it; where it is a bug and nothing failed it
    is listed as missed."""
    from infer_ref.conformance.engines import power

    planted = next(p for p in power.PLANTED if p.name == "engine_embed_normaliser_bf16")
    assert planted.bug_in == ("float32", "float16")  # in bfloat16 the canonical recipe
    runs = [
        {"engine": planted.name, "dtype": "float32", "failed": [], "distributions": []},
        {"engine": planted.name, "dtype": "bfloat16", "failed": [], "distributions": []},
        {"engine": planted.name, "dtype": "float16", "failed": ["test_recipe_x[gemma3-numerics-hidden304-t5]"], "distributions": []},
    ]
    text = power.markdown(runs)
    assert f"| {planted.name} | {planted.bug_class} | ✘ | — | ✔ recipe_x |" in text
    assert f"- {planted.name}: {planted.no_bug_because}." in text
    assert f"- missed where it is a bug: {planted.name} in float32." in text
    runs[1]["failed"] = ["test_y[gemma3-tiny]"]
    assert f"| {planted.name} | {planted.bug_class} | ✘ | **false alarm**: test_y[gemma3-tiny] | ✔ recipe_x |" in power.markdown(runs)
