"""A complete engine-tier adapter for an engine that takes prompts as text and answers tokens as
text or bytes (docs/adapters.md), with the kit's public helpers for both directions.

    infer-ref conformance --engine examples.engine_adapter_text:start --model-dir DIR

The engine is examples/toy_engine.py's text API (replace it with yours): text in, each token's raw
bytes out. ``takes_text_prompts`` tells the tier to draw prompts whose text round-trips through the
folder's tokenizer.
``PromptText`` sends a prompt only where *the engine's* tokenizer gives its ids back, and
``AnswerTokens`` maps each answered token back to an id where exactly one token renders to it
(this engine answers each token's raw bytes; a detokenizer's text and control tokens by name are
read too); anything else raises ``Unsupported`` and the tier leaves that request out, counted in
the report's notes, instead of judging an answer it cannot read exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from examples.toy_engine import ToyEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.engines.text_prompts import AnswerTokens, PromptText
from infer_ref.conformance.interface.contract import Unsupported

CAPABILITIES = frozenset({"ignore_eos", "top_logprobs"})  # greedy text completions, one at a time


class ToyTextEngine:
    capabilities = CAPABILITIES
    takes_text_prompts = True
    alive = True

    def __init__(self, model_dir: Path, options: EngineOptions) -> None:
        self.engine = ToyEngine(model_dir, options.dtype)
        self.prompts = PromptText(model_dir, self.engine.tokenize, engine="the toy text engine")
        self.answers = AnswerTokens(model_dir)
        self.name = f"toy engine ({options.dtype}, text prompts)"

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        return [self._one(r) for r in requests]

    def _one(self, r: EngineRequest) -> EngineOutput:
        if r.temperature != 0 or r.stop or r.prompt_logprobs is not None:
            raise Unsupported("the toy text engine answers greedy completions only")
        steps = self.engine.complete_text(self.prompts.to_text(r.prompt), r.max_tokens, r.logprobs, r.ignore_eos)
        # Each token comes back as its raw bytes: AnswerTokens reads bytes (and texts, and control
        # tokens by name) back to the one id they belong to.
        logprobs = tuple(
            TokenLogprobs(self.answers.to_id(piece), logprob, tuple((self.answers.to_id(p), lp) for p, lp in top))
            for piece, logprob, top in steps
        )
        tokens = tuple(e.token for e in logprobs)
        finish = "stop" if tokens and tokens[-1] in self.engine.eos_ids and not r.ignore_eos else "length"
        text = b"".join(piece for piece, _, _ in steps).decode("utf-8", errors="replace")
        return EngineOutput(tokens, text, logprobs, finish)

    def reset_prefix_cache(self) -> None:
        pass

    def stop(self) -> None:
        pass


def start(model_dir: Path, options: EngineOptions) -> ToyTextEngine:
    torch.set_num_threads(1)
    return ToyTextEngine(Path(model_dir), options)


start.capabilities = CAPABILITIES  # type: ignore[attr-defined]
start.takes_text_prompts = True  # type: ignore[attr-defined]
