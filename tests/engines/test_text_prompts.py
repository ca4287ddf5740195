"""The workload for an engine of text prompts only: text-stable prompts of the same lengths and
structure, and requests whose answers the engine cannot show as ids left out one by one."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from infer_ref.conformance.engines.notes import left_out_note
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineSession
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.engines.workloads.prompts import (
    BLOCK_SIZE,
    SHARED_PREFIX,
    boundary_prompts,
    model_facts,
    shared_prefix_prompts,
)
from infer_ref.conformance.engines.workloads.text_stable import TextStable
from infer_ref.conformance.interface.contract import Unsupported

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
FAMILIES = ["llama-tiny", "qwen3-tiny", "gemma3-tiny"]


def _round_trips(model_dir: Path, prompt: Sequence[int]) -> bool:
    """The definition, written out with the tokenizer alone: decode after the lead, encode with
    the tokenizer's own special tokens, compare."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    lead = tokenizer.encode("", add_special_tokens=True).ids
    if list(prompt[: len(lead)]) != lead:
        return False
    text = tokenizer.decode(list(prompt[len(lead):]), skip_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=True).ids == list(prompt)


def _all_prompts(facts) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return boundary_prompts(facts) + [p for seed in range(3) for p in shared_prefix_prompts(facts, seed=seed)]


@pytest.mark.parametrize("family", FAMILIES)
def test_text_prompts_round_trip_and_keep_the_token_workloads_lengths(family: str) -> None:
    model_dir = FIXTURES / family
    as_text, as_ids = model_facts(model_dir, text_prompts=True), model_facts(model_dir)
    text_prompts, id_prompts = _all_prompts(as_text), _all_prompts(as_ids)
    # the same lengths, but the moved prompt: its second block follows a first block, not the lead
    moved = {len(boundary_prompts(as_ids)) + 4 + 5 * seed for seed in range(3)}
    assert [len(p) for i, p in enumerate(text_prompts) if i not in moved] == [len(p) for i, p in enumerate(id_prompts) if i not in moved]
    assert [len(text_prompts[i]) for i in sorted(moved)] == [2 * BLOCK_SIZE + 9] * 3
    assert all(_round_trips(model_dir, p) for p in text_prompts)
    # the check is not vacuous: the token-id workload's random prompts mostly do not round-trip
    assert sum(_round_trips(model_dir, p) for p in id_prompts) < len(id_prompts) // 2
    assert all(t not in as_text.special_ids for p in text_prompts for t in p[len(as_text.text.lead):])  # type: ignore[union-attr]


@pytest.mark.parametrize("family", FAMILIES)
def test_text_shared_prefix_prompts_share_the_prefix_and_move_the_second_block(family: str) -> None:
    facts = model_facts(FIXTURES / family, text_prompts=True)
    *shared, moved = shared_prefix_prompts(facts)
    prefix = shared[0][:SHARED_PREFIX]
    assert all(p[:SHARED_PREFIX] == prefix for p in shared)
    assert len({p[SHARED_PREFIX:] for p in shared}) == len(shared)  # each its own tail
    # the second block again, at the same depth, after another first block: never a prefix hit
    assert moved[BLOCK_SIZE : 2 * BLOCK_SIZE] == prefix[BLOCK_SIZE : 2 * BLOCK_SIZE]
    assert moved[:BLOCK_SIZE] != prefix[:BLOCK_SIZE]


def test_token_workload_is_unchanged_the_moved_prompt_starts_with_the_second_block() -> None:
    facts = model_facts(FIXTURES / "llama-tiny")
    assert facts.text is None
    *shared, moved = shared_prefix_prompts(facts)
    assert moved[:BLOCK_SIZE] == shared[0][BLOCK_SIZE : 2 * BLOCK_SIZE] and len(moved) == BLOCK_SIZE + 9


@pytest.mark.parametrize("family", FAMILIES)
def test_text_mode_keeps_exactly_the_canonical_prompts_that_round_trip(family: str) -> None:
    model_dir = FIXTURES / family
    every = model_facts(model_dir).canonical
    kept = model_facts(model_dir, text_prompts=True).canonical
    assert kept == tuple(c for c in every if _round_trips(model_dir, c))


def test_drawing_is_seeded() -> None:
    facts = model_facts(FIXTURES / "qwen3-tiny", text_prompts=True)
    again = model_facts(FIXTURES / "qwen3-tiny", text_prompts=True)
    assert boundary_prompts(facts, seed=4) == boundary_prompts(again, seed=4) != boundary_prompts(facts, seed=5)


def test_draw_refuses_a_start_that_does_not_round_trip_and_a_length_shorter_than_the_lead() -> None:
    text = TextStable(FIXTURES / "llama-tiny")
    assert text.lead == (433,)  # llama-tiny's tokenizer.json puts <|begin_of_text|> (433) before any text
    pool = list(range(400))
    with pytest.raises(ValueError, match="cannot extend .* its own text does not give it back"):
        text.draw(3, pool, random.Random(0), after=(64,))  # no lead: the tokenizer would add one
    with pytest.raises(ValueError, match="a prompt of 0 tokens cannot hold the tokenizer's lead"):
        text.draw(0, pool, random.Random(0))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        TextStable(FIXTURES)


CALLS: list[tuple[int, ...]] = []  # the prompts the fake engine ran, in order
RESETS: list[int] = []  # how many prompts it had run at each prefix-cache reset


class FakeTextEngine:
    """A text-only engine whose answers to some prompts cannot be read back (it raises Unsupported)."""

    capabilities = frozenset({"seed", "reset_prefix_cache"})
    takes_text_prompts = True
    def __init__(self, unreadable: frozenset[tuple[int, ...]]) -> None:
        self.name, self.unreadable = "fake text engine", unreadable

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        out = []
        for r in requests:
            CALLS.append(r.prompt)
            if r.prompt in self.unreadable:
                raise Unsupported(f"the answer to {r.prompt} holds a token text several tokens render to")
            out.append(EngineOutput((7,), "x", (), "length"))
        return out

    def reset_prefix_cache(self) -> None:
        RESETS.append(len(CALLS))

    def stop(self) -> None: ...


UNREADABLE = frozenset({(1, 2)})


def text_factory(model_dir: Path, options: EngineOptions) -> EngineHandle:
    return FakeTextEngine(UNREADABLE)


text_factory.takes_text_prompts = True  # type: ignore[attr-defined]


def ids_factory(model_dir: Path, options: EngineOptions) -> EngineHandle:
    return FakeTextEngine(UNREADABLE)


def test_judgeable_leaves_out_only_the_unreadable_requests_and_notes_why(tmp_path: Path) -> None:
    CALLS.clear()
    RESETS.clear()
    tier = EngineSession(TierSettings(engine=f"{__name__}:text_factory", endpoint=None, dtype="float32"))
    requests = [EngineRequest((1, 2), 3), EngineRequest((3, 4), 3), EngineRequest((5,), 3)]
    assert tier.judgeable(tmp_path, requests) == [requests[1], requests[2]]
    assert tier.judgeable(tmp_path, requests) == [requests[1], requests[2]]
    assert CALLS == [(1, 2), (3, 4), (5,)]  # each request run once, then remembered
    assert RESETS == [3]  # after the first look only: the test's own first pass meets a cold cache
    assert tier.ledger.left_out == ["Unsupported: the answer to (1, 2) holds a token text several tokens render to"]
    assert left_out_note(tier.name, tier.ledger.left_out, len(tier.ledger.unreadable)).endswith("ids: 1 of 3 (1× Unsupported: the answer to (1, 2) holds a token text several tokens render to)")
    with pytest.raises(Unsupported, match=r"none of the 1 requests has an answer .* \(Unsupported: the answer to \(1, 2\)"):
        tier.judgeable(tmp_path, [requests[0]])


def test_judgeable_runs_nothing_for_an_engine_of_token_prompts(tmp_path: Path) -> None:
    CALLS.clear()
    tier = EngineSession(TierSettings(engine=f"{__name__}:ids_factory", endpoint=None, dtype="float32"))
    requests = [EngineRequest((1, 2), 3), EngineRequest((3, 4), 3)]
    assert not tier.takes_text_prompts(tmp_path)
    assert tier.judgeable(tmp_path, requests) == requests and CALLS == [] and not tier.ledger.left_out


def refused_text_factory(model_dir: Path, options: EngineOptions) -> EngineHandle:
    raise Unsupported("this engine cannot run the stressed start")


refused_text_factory.takes_text_prompts = True  # type: ignore[attr-defined]


def test_a_refused_start_is_the_tests_not_supported_not_a_requests(tmp_path: Path) -> None:
    tier = EngineSession(TierSettings(engine=f"{__name__}:refused_text_factory", endpoint=None, dtype="float32"))
    with pytest.raises(Unsupported, match=r"\(stressed start\): Unsupported: this engine cannot run"):
        tier.judgeable(tmp_path, [EngineRequest((1, 2), 3)])
    assert not tier.ledger.left_out
