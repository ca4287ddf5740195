"""The workload for an engine of text prompts only: text-stable prompts of the same lengths and
structure, and requests whose answers the engine cannot show as ids left out one by one."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from infer_ref.conformance.engines.adapters.openai_text import token_pieces
from infer_ref.conformance.engines.notes import left_out_note
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineSession
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.engines.text_prompts import AnswerTokens
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
    # on the plain engine: the stressed one (the tests') sees each request first when a test sends it
    assert list(tier.started) == [(str(tmp_path), "plain")] and RESETS == []
    assert tier.alone(tmp_path, requests[1]).token_ids == (7,) and CALLS == [(1, 2), (3, 4), (5,)]  # the look is alone()'s run
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
    with pytest.raises(Unsupported, match=r"\(probe start\): Unsupported: this engine cannot run"):
        tier.judgeable(tmp_path, [EngineRequest((1, 2), 3)])
    assert not tier.ledger.left_out and set(tier.refused) == {(str(tmp_path), "plain"), (str(tmp_path), "probe")}


def no_plain_text_factory(model_dir: Path, options: EngineOptions) -> EngineHandle:
    if not options.prefix_caching:
        raise Unsupported("this engine cannot turn its prefix cache off")
    return FakeTextEngine(UNREADABLE)


no_plain_text_factory.capabilities = frozenset({"prefix_caching", "reset_prefix_cache"})  # type: ignore[attr-defined]
no_plain_text_factory.takes_text_prompts = True  # type: ignore[attr-defined]


def test_an_engine_without_a_plain_start_is_looked_at_on_a_separate_start_not_the_judged_one(tmp_path: Path) -> None:
    CALLS.clear()
    tier = EngineSession(TierSettings(engine=f"{__name__}:no_plain_text_factory", endpoint=None, dtype="float32"))
    request = EngineRequest((3, 4), 3)
    assert tier.judgeable(tmp_path, [request]) == [request] and CALLS == [(3, 4)]
    probe = tier.started[(str(tmp_path), "probe")]
    assert tier.handle(tmp_path, "stressed") is not probe and CALLS == [(3, 4)]


# -- AnswerTokens: the renderings engines use for a token -----------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_answer_tokens_read_a_token_rendered_as_text_and_refuse_an_empty_or_cut_one(family: str) -> None:
    """A detokenizer's text (control tokens empty, invalid UTF-8 dropped): ordinary tokens read back,
    the empty text (any control token) and a cut character's leftover never."""
    model_dir = FIXTURES / family
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    answers = AnswerTokens(model_dir)
    text = "Hello, world: the cat sat"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert [answers.to_id(tokenizer.decode([i])) for i in ids] == ids
    with pytest.raises(Unsupported, match=r"the token text '', which several of"):
        answers.to_id("")
    with pytest.raises(Unsupported, match=r"the token text 'no such token text', which none of"):
        answers.to_id("no such token text")


@pytest.mark.parametrize(("family", "name", "token_id"), [("gemma3-tiny", "<end_of_turn>", 6), ("llama-tiny", "<|eot_id|>", 438),
                                                          ("qwen3-tiny", "<|im_end|>", 394)])  # fmt: skip
def test_answer_tokens_read_a_control_token_rendered_by_name(family: str, name: str, token_id: int) -> None:
    # the ids are the folders' tokenizer.json added_tokens
    assert AnswerTokens(FIXTURES / family).to_id(name) == token_id


@pytest.mark.parametrize("family", FAMILIES)
def test_answer_tokens_read_a_token_rendered_as_its_bytes(family: str) -> None:
    """Raw bytes, a cut character's bytes included: the pieces of a text's tokens join to its UTF-8."""
    model_dir = FIXTURES / family
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    answers = AnswerTokens(model_dir)
    text = "naïve café — 東京"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = token_pieces(tokenizer, 10**6)
    assert b"".join(pieces[i] for i in ids) == text.encode()  # the oracle: the text's own bytes
    assert any(not _valid_utf8(pieces[i]) for i in ids)  # not vacuous: some token holds part of a character
    assert [answers.to_id(pieces[i]) for i in ids] == ids
    [eos] = [i for i, t in tokenizer.get_added_tokens_decoder().items() if t.content in ("<eos>", "<|end_of_text|>", "<|endoftext|>")]
    assert answers.to_id(tokenizer.id_to_token(eos).encode()) == eos
    with pytest.raises(Unsupported, match=r"the engine answered the bytes b'\\xff\\xfe', which none of"):
        answers.to_id(b"\xff\xfe")


def _valid_utf8(piece: bytes) -> bool:
    try:
        piece.decode()
    except UnicodeDecodeError:
        return False
    return True
