"""The requests the engine tier sends: prompts that cross block boundaries and sliding windows,
prompts that share prefixes, and (for the fixture checkpoints) the canonical prompts whose greedy
answers end at an EOS token.

All prompts are token ids, drawn from a seeded generator over the model's vocabulary (special ids
excluded), so every engine sees exactly the same tokens whatever its tokenizer does with text. For
an engine that takes prompts as text only, the same lengths and structure are drawn text-stable
(text_stable.py): ids whose text the folder's tokenizer turns back into exactly them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.workloads.text_stable import TextStable

BLOCK_SIZE = 32  # the tier's KV block size: vLLM's CPU backend needs a multiple of 32
GENERATED = 16  # tokens generated per request: decode crosses a block boundary from k*bs - 1
SHARED_PREFIX = 2 * BLOCK_SIZE + 5  # two full blocks shared, then a partial one
EXTENSION = 7  # tokens an extending prompt adds after a prompt computed before
NEW_TURN = 9  # tokens a continued conversation's new turn adds after the previous prompt and answer


@dataclass(frozen=True)
class ModelFacts:
    """What the tier reads from a checkpoint folder itself (never from the engine)."""

    name: str
    vocab_size: int  # the model's (config.json); a padded vocabulary may exceed the tokenizer's
    text_vocab_size: int  # ids the tokenizer can decode: prompts are drawn below it
    eos_ids: frozenset[int]  # config.json and generation_config.json, united
    special_ids: frozenset[int]
    canonical: tuple[tuple[int, ...], ...]  # prompts whose greedy answer ends at EOS (fixtures only)
    text: TextStable | None = field(default=None, compare=False)  # set: prompts are drawn text-stable


def model_facts(model_dir: Path, *, text_prompts: bool = False) -> ModelFacts:
    """What the tier reads from ``model_dir``; ``text_prompts``: the engine takes prompts as text
    only, so every prompt is drawn text-stable and canonical prompts that are not are left out."""
    config = json.loads((model_dir / "config.json").read_text())
    eos: set[int] = set(_ids(config.get("eos_token_id")))
    generation = model_dir / "generation_config.json"
    if generation.is_file():
        eos |= set(_ids(json.loads(generation.read_text()).get("eos_token_id")))
    special = set(eos) | {i for k in ("bos_token_id", "pad_token_id") for i in _ids(config.get(k))}
    vocab_size = int(config["vocab_size"])
    text_vocab_size = vocab_size
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        spec = json.loads(tokenizer.read_text())
        added = {int(t["id"]) for t in spec.get("added_tokens", [])}
        special |= added
        ids = set(spec.get("model", {}).get("vocab", {}).values()) | added
        text_vocab_size = min(vocab_size, max(ids) + 1) if ids else vocab_size
    canonical: tuple[tuple[int, ...], ...] = ()
    provenance = model_dir / "PROVENANCE.json"
    if provenance.is_file():
        canonical = tuple(
            tuple(c["prompt_ids"]) for c in json.loads(provenance.read_text()).get("canonical", [])
        )
    text = TextStable(model_dir) if text_prompts else None
    if text is not None:
        canonical = tuple(c for c in canonical if text.round_trips(c))
    return ModelFacts(
        model_dir.name, vocab_size, text_vocab_size, frozenset(eos), frozenset(special), canonical, text
    )


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]  # type: ignore[call-overload]


def random_prompt(
    facts: ModelFacts, length: int, rng: random.Random, *, after: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """``length`` ordinary (non-special) token ids; text-stable ones where ``facts.text`` is set (then
    a prompt's first ids are the tokenizer's lead, and ``after + result`` round-trips)."""
    ordinary = [t for t in range(facts.text_vocab_size) if t not in facts.special_ids]
    if facts.text is not None:
        return facts.text.draw(length, ordinary, rng, after=after)
    return tuple(rng.choice(ordinary) for _ in range(length))


def boundary_prompts(facts: ModelFacts, seed: int = 0) -> list[tuple[int, ...]]:
    """Prompts of k*bs - 1, k*bs and k*bs + 1 tokens (k = 1, 2, 3) and one short one."""
    rng = random.Random(f"{facts.name}/boundaries/{seed}")
    lengths = [5] + [k * BLOCK_SIZE + d for k in (1, 2, 3) for d in (-1, 0, 1)]
    return [random_prompt(facts, n, rng) for n in lengths]


def shared_prefix_prompts(facts: ModelFacts, count: int = 4, seed: int = 0) -> list[tuple[int, ...]]:
    """``count`` prompts sharing their first ``SHARED_PREFIX`` tokens, each with its own tail, then
    one that *starts* with their second block: the same block content at another depth, after
    another first block, must never be a hit (a block's hash chains its parent's)."""
    rng = random.Random(f"{facts.name}/shared/{seed}")
    prefix = random_prompt(facts, SHARED_PREFIX, rng)
    shared = [prefix + random_prompt(facts, 3 + 7 * i, rng, after=prefix) for i in range(count)]
    if facts.text is None:
        moved = prefix[BLOCK_SIZE : 2 * BLOCK_SIZE]
    else:  # text prompts start with the tokenizer's lead: the second block follows another first block
        moved = _after_another_first_block(facts, facts.text, prefix[BLOCK_SIZE : 2 * BLOCK_SIZE], rng)
    return [*shared, moved + random_prompt(facts, 9, rng, after=moved)]


def extending_prompts(
    facts: ModelFacts, prompts: list[tuple[int, ...]], seed: int = 0
) -> list[tuple[int, ...]]:
    """Each prompt followed by ``EXTENSION`` fresh tokens: a prompt that extends past one computed
    before, which a prefix cache serves whatever it does with an identical prompt (some engines
    reuse a prefix only when the new prompt goes past it)."""
    rng = random.Random(f"{facts.name}/extending/{seed}")
    return [p + random_prompt(facts, EXTENSION, rng, after=p) for p in prompts]


def continuation_prompts(
    facts: ModelFacts,
    turns: list[tuple[tuple[int, ...], tuple[int, ...]]],
    seed: int = 0,
    *,
    new_turn: int = NEW_TURN,
    stream: str = "",
    left_out: list[str] | None = None,
) -> list[tuple[int, ...]]:
    """A conversation continued: each ``(prompt, answer)`` (:func:`history`) followed by a new turn
    of ``new_turn`` fresh tokens. Sent after the first turn, a prefix-caching engine serves the
    prompt and answer from cache; past a sliding window, the cached part is longer than the window.
    A turn whose history cannot be sent as text is left out, its reason appended to ``left_out``.
    ``stream`` names the new turns' random stream (default ``continued/<seed>``)."""
    rng = random.Random(f"{facts.name}/{stream or f'continued/{seed}'}")
    prompts = []
    for prompt, answer in turns:
        before = history(facts, prompt, answer)
        if before is None:
            if left_out is not None:
                left_out.append(
                    f"the {len(prompt)}-token prompt and its {len(answer)}-token answer do not round-trip "
                    "through text, nor do the ids their text tokenizes to"
                )
            continue
        prompts.append(before + random_prompt(facts, new_turn, rng, after=before))
    return prompts


def history(facts: ModelFacts, prompt: tuple[int, ...], answer: tuple[int, ...]) -> tuple[int, ...] | None:
    """A first turn and the model's answer as the next turn carries them: as they are; for an engine
    of text prompts, where their text does not give them back (a model's greedy answer often is not
    the tokenizer's own split of its text), the ids that text tokenizes to, as a chat server sends
    an answer back. The prompt that follows is judged on exactly those ids. None where even those do
    not round-trip."""
    return prompt + answer if facts.text is None else facts.text.as_sent(prompt + answer)


def _after_another_first_block(
    facts: ModelFacts, text: TextStable, block: tuple[int, ...], rng: random.Random
) -> tuple[int, ...]:
    """A fresh first block, then ``block``: the same block content at the same depth after another
    parent (still never a hit), drawn until the whole round-trips through text."""
    for _ in range(100):
        candidate = random_prompt(facts, BLOCK_SIZE, rng) + block
        if text.round_trips(candidate):
            return candidate
    raise ValueError(
        f"{facts.name}: no first block of 100 drawn lets the shared second block round-trip through text"
    )


def greedy_requests(
    prompts: list[tuple[int, ...]],
    *,
    ignore_eos: bool,
    prompt_logprobs: int | None = None,
    max_tokens: int = GENERATED,
    logprobs: int = 5,
) -> list[EngineRequest]:
    return [
        EngineRequest(
            p, max_tokens, ignore_eos=ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )
        for p in prompts
    ]


PROMPT_LOGPROBS = 5  # top-k asked for at each prompt position of the agreement workload


def agreement_workload(
    facts: ModelFacts, *, ignore_eos: bool, prompt_logprobs: int | None = None
) -> list[EngineRequest]:
    """The agreement tests' requests: prompts across block boundaries and sliding windows, prompts
    sharing a prefix, and (fixtures) two canonical prompts, each generating greedily."""
    prompts = boundary_prompts(facts) + shared_prefix_prompts(facts) + list(facts.canonical[:2])
    return greedy_requests(prompts, ignore_eos=ignore_eos, prompt_logprobs=prompt_logprobs)


def first_turns(facts: ModelFacts, *, ignore_eos: bool) -> list[EngineRequest]:
    """A conversation's first turns: the boundary prompts (5 to 97 tokens), each answered greedily."""
    return greedy_requests(boundary_prompts(facts, seed=5), ignore_eos=ignore_eos)


def continued_turns(
    facts: ModelFacts,
    first: list[EngineRequest],
    answers: list[EngineOutput],
    *,
    ignore_eos: bool,
    left_out: list[str] | None = None,
    max_tokens: int = GENERATED,
    **new_turns: Any,
) -> list[EngineRequest]:
    """Each first turn continued: its prompt, the engine's own answer, and a new turn (a turn that
    cannot be sent as text left out, with its reason appended to ``left_out``), each generating
    ``max_tokens``. ``new_turns``: how :func:`continuation_prompts` draws the new turns (the default
    workload's: seed 5)."""
    turns = [(r.prompt, tuple(a.token_ids)) for r, a in zip(first, answers, strict=True)]
    prompts = continuation_prompts(facts, turns, left_out=left_out, **(new_turns or {"seed": 5}))
    return greedy_requests(prompts, ignore_eos=ignore_eos, max_tokens=max_tokens)


# What a detokenizer shows for the bytes of a character that a token boundary cut in two: text no
# engine generates, so a stop string holding it can never be met by an engine that matches stop
# strings on its output bytes (or on text decoded whole).
REPLACEMENT_CHARACTER = "\ufffd"


def stop_string_in(text: str) -> str | None:
    """A stop string drawn from an answer's ``text``: a 2-3 character piece found at least twice,
    not blank, holding no replacement character, its first occurrence after the first character
    (so the text expected before it is not empty). None when the text has no such piece."""
    for width in (3, 2):
        for start in range(1, len(text) - width):
            piece = text[start : start + width]
            if (
                piece.strip()
                and REPLACEMENT_CHARACTER not in piece
                and text.count(piece) >= 2
                and text.find(piece) == start
            ):
                return piece
    return None
