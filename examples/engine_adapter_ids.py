"""A complete engine-tier adapter for an in-process engine that takes token ids (docs/adapters.md).

    infer-ref conformance --engine examples.engine_adapter_ids:start --model-dir DIR

The engine is examples/toy_engine.py (replace it with yours). What the adapter does:
declares what the engine honours (``CAPABILITIES``: the tier skips as "not supported" every
property that needs anything else, and never asks for prefix caching, a chunked-prefill budget or
a small KV budget it did not declare); turns each request into the engine's call and each answer
into an ``EngineOutput`` with logprobs of the model's raw logits; refuses what it cannot honour
with ``Unsupported`` (never a silently different engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from examples.toy_engine import ToyEngine
from infer_ref.conformance.engines.logprobs import token_logprobs
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported

# One request at a time, no prefix cache, no stop strings, no top-k/top-p filters, no prompt logprobs.
CAPABILITIES = frozenset({"seed", "ignore_eos", "top_logprobs"})


class ToyIdsEngine:
    capabilities = CAPABILITIES
    alive = True  # set False when the engine died: the tier starts a fresh one for the next test

    def __init__(self, model_dir: Path, options: EngineOptions) -> None:
        # Every start also carries block_size, kv_cache_tokens and max_model_len: sizes that do not
        # change what a correct engine answers. This engine has no such settings and ignores them.
        if options.prefix_caching or options.max_num_batched_tokens is not None:
            raise Unsupported("the toy engine has no prefix cache and prefills whole")  # not declared: never asked
        self.engine = ToyEngine(model_dir, options.dtype)
        self.name = f"toy engine ({options.dtype}, token ids)"

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        return [self._one(r) for r in requests]  # not "batch": the tier sends one request per call where it matters

    def _one(self, r: EngineRequest) -> EngineOutput:
        if r.stop or r.top_k or r.top_p < 1.0 or r.prompt_logprobs is not None:
            raise Unsupported("the toy engine honours no stop strings, filters or prompt logprobs")
        try:
            steps = self.engine.complete_ids(list(r.prompt), r.max_tokens, r.temperature, r.seed, r.ignore_eos)
        except RuntimeError:
            self.alive = False
            raise
        tokens = tuple(s.token for s in steps)
        ended = bool(tokens) and tokens[-1] in self.engine.eos_ids and not r.ignore_eos
        return EngineOutput(
            token_ids=tokens,
            text=self.engine.tokenizer.decode(list(tokens), skip_special_tokens=True),
            logprobs=tuple(token_logprobs(s.logits, s.token, r.logprobs) for s in steps),
            finish_reason="stop" if ended else "length",
        )

    def reset_prefix_cache(self) -> None:
        pass  # no prefix cache (not declared: never called)

    def stop(self) -> None:
        pass  # nothing outside this process


def start(model_dir: Path, options: EngineOptions, *, threads: int = 1) -> ToyIdsEngine:
    """The factory ``--engine`` names; ``threads`` is an engine option (``--engine-option threads=2``)."""
    torch.set_num_threads(threads)
    return ToyIdsEngine(Path(model_dir), options)


start.capabilities = CAPABILITIES  # type: ignore[attr-defined]
