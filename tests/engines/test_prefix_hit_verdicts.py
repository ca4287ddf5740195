"""Prefix caches that hit unusually are judged where they can be and "not judged" where they cannot,
never failed (old: an engine reusing a prefix only when a prompt extends past it got "fail" from the
warm-cache test, which saw no hit; and no test ever looked at how much a cache served)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.conformance.engines.ledger import Ledger
from infer_ref.conformance.engines.verdicts.judge import judge_prefix_hits
from infer_ref.conformance.engines.verdicts.prefix_hits import (
    CountedPair,
    PrefixHit,
    expected_hit,
    granularity,
    shortfalls,
    summary,
)
from infer_ref.errors import EXIT_NOT_JUDGED

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"
TESTS = ("test_warm_prefix_cache_matches_cold", "test_prefix_cache_serves_the_shared_prefix")


def test_a_paged_cache_serving_every_whole_block_has_no_shortfall() -> None:
    hits = [PrefixHit(5, 0), PrefixHit(31, 0), PrefixHit(33, 32), PrefixHit(64, 64), PrefixHit(97, 96)]
    assert granularity(hits) == 32 and shortfalls(hits) == []


def test_a_lookup_stuck_at_the_first_block_falls_short_where_more_is_shared() -> None:
    hits = [PrefixHit(33, 32), PrefixHit(65, 32), PrefixHit(97, 32)]
    # granularity 32; at least ((65 - 1) // 32) * 32 = 64 and ((97 - 1) // 32) * 32 = 96 expected
    assert shortfalls(hits) == [
        "request 1: 32 of 65 shared prompt tokens served from cache, at least 64 expected (hits come in multiples of 32)",
        "request 2: 32 of 97 shared prompt tokens served from cache, at least 96 expected (hits come in multiples of 32)",
    ]


def test_a_token_level_cache_is_held_to_all_but_one_shared_token() -> None:
    assert granularity([PrefixHit(40, 40), PrefixHit(97, 97)]) == 1
    assert shortfalls([PrefixHit(40, 39), PrefixHit(97, 97)]) == []
    assert shortfalls([PrefixHit(40, 39), PrefixHit(97, 95)]) == [
        "request 1: 95 of 97 shared prompt tokens served from cache, at least 96 expected (hits come in multiples of 1)"
    ]


def test_large_blocks_are_not_a_shortfall_and_no_hit_at_all_is_not_judged() -> None:
    # an engine with 64-token blocks: 33 shared tokens fill no block of its own
    assert shortfalls([PrefixHit(33, 0), PrefixHit(97, 64)]) == []
    assert expected_hit(97, 64) == 64 and expected_hit(0, 32) == 0
    assert shortfalls([PrefixHit(97, 0), PrefixHit(64, 0)]) is None


def test_the_note_counts_hits_and_tokens() -> None:
    assert summary([PrefixHit(97, 96), PrefixHit(5, 0)]) == (
        "prefix cache hits observed: 1 of 2 extending requests hit, 96 of 102 shared prompt tokens served "
        "from cache, in multiples of 96 tokens"
    )


def _tier(engine: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", engine, "--model-dir", str(LLAMA),
           "--report", str(report), "-k", " or ".join(TESTS)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    return done, json.loads(report.read_text()) if report.is_file() else {}


@pytest.mark.kit_run
def test_a_cache_that_reuses_only_extended_prompts_is_judged_and_passes(tmp_path: Path) -> None:
    done, report = _tier("prefix_cache_engines:extending_only", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert report["totals"]["counts"]["passed"] == len(TESTS), report["totals"]
    assert any(n.startswith("prefix cache hits observed: 8 of 10") for n in report["notes"]), report["notes"]


@pytest.mark.kit_run
def test_a_cache_that_never_hits_is_not_judged_rather_than_failed(tmp_path: Path) -> None:
    done, report = _tier("prefix_cache_engines:no_hits", tmp_path)
    assert done.returncode == EXIT_NOT_JUDGED, done.stdout[-3000:]
    assert report["totals"]["counts"] == {**report["totals"]["counts"], "failed": 0, "not judged": len(TESTS)}
    assert report["not_judged"].startswith("no prefix hit observed"), report["not_judged"]


def test_a_count_on_the_first_request_of_an_emptied_cache_makes_the_counts_not_judged_not_failed() -> None:
    # Served nothing, reported 1 for every request: gcd 1 would claim shortfalls of 32 and 96 tokens.
    pairs = [CountedPair(33, 1, 1), CountedPair(97, 1, 1)]
    assert shortfalls([PrefixHit(p.shared, p.second) for p in pairs])  # what the counts alone would say
    ledger = Ledger()
    with pytest.raises(pytest.skip.Exception, match=r"^not judged: cached-token counts that cannot be believed: an engine "
                       r"reported 1 cached tokens for a request sent first on an emptied prefix cache \(2 of 2"):  # fmt: skip
        judge_prefix_hits(
            ledger=ledger, engine="an engine", pairs=pairs, requests="prompts", computed="the prompt"
        )
    assert ledger.prefix_hits == []


def test_a_count_not_reported_is_left_out_and_none_reported_is_not_judged() -> None:
    ledger = Ledger()
    with pytest.raises(
        pytest.skip.Exception, match=r"no cached-token count reported: an engine answered cached_tokens None"
    ):
        judge_prefix_hits(
            ledger=ledger,
            engine="an engine",
            pairs=[CountedPair(33, None, None), CountedPair(97, 0, None)],
            requests="prompts",
            computed="the prompt",
        )
    # None is "not reported", never "no hit": the reported pair alone is judged, and its shortfall fails
    with pytest.raises(
        AssertionError,
        match=r"1 of 1 prompts\):\nrequest 0: 32 of 97 shared prompt tokens served from cache, at least 96",
    ):
        judge_prefix_hits(
            ledger=ledger,
            engine="an engine",
            pairs=[CountedPair(33, 0, None), CountedPair(97, None, 32)],
            requests="prompts",
            computed="the prompt",
        )
    assert ledger.prefix_hits == [PrefixHit(97, 32)]
    with pytest.raises(pytest.skip.Exception, match=r"no prompts could be sent and read back"):
        judge_prefix_hits(
            ledger=ledger, engine="an engine", pairs=[], requests="prompts", computed="the prompt"
        )
