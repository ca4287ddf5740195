"""The requests the engine tier sends: prompts that cross block boundaries and sliding windows,
prompts that share prefixes, and (for the fixture checkpoints) the canonical prompts whose greedy
answers end at an EOS token.

All prompts are token ids, drawn from a seeded generator over the model's vocabulary (special ids
excluded), so every engine sees exactly the same tokens whatever its tokenizer does with text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineRequest

BLOCK_SIZE = 32  # the tier's KV block size: vLLM's CPU backend needs a multiple of 32
GENERATED = 16  # tokens generated per request: decode crosses a block boundary from k*bs - 1
SHARED_PREFIX = 2 * BLOCK_SIZE + 5  # two full blocks shared, then a partial one


@dataclass(frozen=True)
class ModelFacts:
    """What the tier reads from a checkpoint folder itself (never from the engine)."""

    name: str
    vocab_size: int  # the model's (config.json); a padded vocabulary may exceed the tokenizer's
    text_vocab_size: int  # ids the tokenizer can decode: prompts are drawn below it
    eos_ids: frozenset[int]  # config.json and generation_config.json, united
    special_ids: frozenset[int]
    canonical: tuple[tuple[int, ...], ...]  # prompts whose greedy answer ends at EOS (fixtures only)


def model_facts(model_dir: Path) -> ModelFacts:
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
        canonical = tuple(tuple(c["prompt_ids"]) for c in json.loads(provenance.read_text()).get("canonical", []))
    name = model_dir.name
    return ModelFacts(name, vocab_size, text_vocab_size, frozenset(eos), frozenset(special), canonical)


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]  # type: ignore[call-overload]


def random_prompt(facts: ModelFacts, length: int, rng: random.Random) -> tuple[int, ...]:
    """``length`` ordinary (non-special) token ids."""
    ordinary = [t for t in range(facts.text_vocab_size) if t not in facts.special_ids]
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
    shared = [prefix + random_prompt(facts, 3 + 7 * i, rng) for i in range(count)]
    moved = prefix[BLOCK_SIZE : 2 * BLOCK_SIZE] + random_prompt(facts, 9, rng)
    return [*shared, moved]


def greedy_requests(prompts: list[tuple[int, ...]], *, ignore_eos: bool, prompt_logprobs: int | None = None,
                    max_tokens: int = GENERATED, logprobs: int = 5) -> list[EngineRequest]:  # fmt: skip
    return [
        EngineRequest(p, max_tokens, ignore_eos=ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        for p in prompts
    ]
