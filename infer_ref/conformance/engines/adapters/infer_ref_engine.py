"""infer_ref's own :class:`~infer_ref.engine.engine.Engine` through the engine tier (``--engine infer_ref``).

A known-good engine judged by the same properties as any other: paged KV with prefix caching,
batched decode, chunked prefill under a per-step token budget, preemption when its pool runs out.
It always stops at the model's EOS ids, and says so (no ``ignore_eos``).

Prompt logprobs are computed through the engine itself: the prompt's first token is fed and the
rest teacher-forced (``forced_tokens``), so they come out of its paged cache like any decode step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from infer_ref.conformance.engines.logprobs import prompt_logprobs_from, token_logprobs
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.devices import device_label
from infer_ref.engine.engine import Engine, EngineResult
from infer_ref.loader import load_model
from infer_ref.sampling import SamplingParams
from infer_ref.tokenizer import Tokenizer

CAPABILITIES = frozenset(
    {
        "prompt_logprobs",
        "seed",
        "stop_strings",
        "prefix_caching",
        "cached_tokens",
        "reset_prefix_cache",
        "kv_budget",
        "block_size",
        "batch",
        "top_k_top_p",
        "top_logprobs",
        "chunked_prefill",
    }
)
DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_TOKENS = 8192  # ample for the tier's requests: nothing is preempted unless a budget is set
TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class InferRefEngine:
    """An :class:`~infer_ref.conformance.engines.protocol.EngineHandle` over infer_ref's Engine."""

    capabilities = CAPABILITIES
    reproducible = True  # repro scripts start this engine as it is
    engine_class: type[Engine] = Engine  # a planted bug may run a subclass

    def __init__(self, model_dir: Path, options: EngineOptions, *, device: str = "cpu") -> None:
        model, _ = load_model(model_dir, dtype=TORCH_DTYPES[options.dtype], device=device)
        block_size = options.block_size or DEFAULT_BLOCK_SIZE
        kv_tokens = options.kv_cache_tokens or DEFAULT_KV_TOKENS
        self.tokenizer = Tokenizer(model_dir)
        self.engine = self.engine_class(
            model,
            self.tokenizer,
            num_blocks=max(1, kv_tokens // block_size),
            block_size=block_size,
            enable_prefix_caching=options.prefix_caching,
            max_batch=options.max_num_seqs or 8,
            max_num_batched_tokens=options.max_num_batched_tokens,
        )
        budget = (
            f", {options.max_num_batched_tokens} tokens per step" if options.max_num_batched_tokens else ""
        )
        pool = f"block {block_size}, {self.engine.pool.num_blocks} blocks{budget}"
        self.name = f"infer_ref Engine ({options.dtype} on {device_label(device)}, {pool})"
        self.options = options
        self.device = device

    def repro_snippet(self) -> str | None:
        """The engine as a repro script starts and runs it
        (:mod:`infer_ref.conformance.engines.verdicts.repro`)."""
        if not self.reproducible:
            return None
        e = self.engine
        return _REPRO.format(
            dtype=self.options.dtype,
            device=self.device,
            num_blocks=e.pool.num_blocks,
            block_size=e.block_size,
            prefix=e.enable_prefix_caching,
            max_batch=e.max_batch,
            budget=e.max_num_batched_tokens,
        )

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        for i, r in enumerate(requests):
            if r.ignore_eos:
                raise Unsupported(
                    f"request {i}: infer_ref's Engine always stops at the model's EOS ids (no ignore_eos)"
                )
        results = self.engine.generate(
            [list(r.prompt) for r in requests], [_params(r) for r in requests], keep_logits=True
        )
        prompt_lp = self._prompt_logprobs(requests)
        return [
            _output(r, res, prompt_lp.get(i))
            for i, (r, res) in enumerate(zip(requests, results, strict=True))
        ]

    def reset_prefix_cache(self) -> None:
        self.engine.blocks.reset()

    def stop(self) -> None:
        pass  # nothing outside this process

    def _prompt_logprobs(self, requests: Sequence[EngineRequest]) -> dict[int, tuple]:
        """Prompt logprobs of the requests that ask for them, from one teacher-forced engine call."""
        wanted = [i for i, r in enumerate(requests) if r.prompt_logprobs is not None and len(r.prompt) > 1]
        out: dict[int, tuple] = {i: (None,) for i, r in enumerate(requests) if r.prompt_logprobs is not None}
        if not wanted:
            return out
        forced = [list(requests[i].prompt[1:]) for i in wanted]
        params = [SamplingParams(temperature=0.0, max_new_tokens=len(f)) for f in forced]
        results = self.engine.generate(
            [list(requests[i].prompt[:1]) for i in wanted], params, forced_tokens=forced, keep_logits=True
        )
        for i, res in zip(wanted, results, strict=True):
            assert res.step_logits is not None
            out[i] = prompt_logprobs_from(
                res.step_logits, requests[i].prompt, requests[i].prompt_logprobs or 0
            )
        return out


_REPRO = """# needs: infer_ref (the engine under test)
from infer_ref.engine.engine import Engine
from infer_ref.loader import load_model
from infer_ref.sampling import SamplingParams
from infer_ref.tokenizer import Tokenizer


def start_engine():
    torch.set_num_threads(1)
    model, _ = load_model(MODEL_DIR, dtype=torch.{dtype}, device="{device}")
    return Engine(model, Tokenizer(MODEL_DIR), num_blocks={num_blocks}, block_size={block_size},
                  enable_prefix_caching={prefix}, max_batch={max_batch}, max_num_batched_tokens={budget})


def run(engine, requests):
    params = [SamplingParams(temperature=r["temperature"], top_k=r["top_k"] or None,
                             top_p=r["top_p"] if r["top_p"] < 1 else None, seed=r["seed"],
                             max_new_tokens=r["max_tokens"], stop=tuple(r["stop"])) for r in requests]
    results = engine.generate([r["prompt"] for r in requests], params, keep_logits=True)
    answers = []
    for r, res in zip(requests, results):
        steps = []
        for i, token in enumerate(res.token_ids):
            row = torch.log_softmax(res.step_logits[i].double(), dim=-1)
            values, ids = torch.topk(row, r["logprobs"])
            steps.append([token, float(row[token]), [[int(t), float(v)] for t, v in zip(ids, values)]])
        answers.append({{"token_ids": list(res.token_ids), "steps": steps}})
    return answers
"""


def _params(r: EngineRequest) -> SamplingParams:
    return SamplingParams(
        temperature=r.temperature,
        top_k=r.top_k or None,
        top_p=r.top_p if r.top_p < 1.0 else None,
        seed=r.seed,
        max_new_tokens=r.max_tokens,
        stop=r.stop,
    )


def _output(r: EngineRequest, res: EngineResult, prompt_lp: tuple | None) -> EngineOutput:
    assert res.step_logits is not None  # keep_logits: one row per generated token
    steps = tuple(token_logprobs(res.step_logits[i], t, r.logprobs) for i, t in enumerate(res.token_ids))
    return EngineOutput(
        token_ids=tuple(res.token_ids),
        text=res.text,
        logprobs=steps,
        finish_reason="length" if res.finish_reason == "length" else "stop",
        prompt_logprobs=prompt_lp,
        cached_tokens=res.num_cached_tokens,
    )


def start_infer_ref(model_dir: Path, options: EngineOptions, device: str = "cpu") -> InferRefEngine:
    """``--engine infer_ref``: infer_ref's Engine on ``model_dir`` on ``device`` (``--engine-option
    device=cuda`` for a GPU; on the CPU one torch thread is the caller's choice)."""
    return InferRefEngine(Path(model_dir), options, device=device)


start_infer_ref.capabilities = CAPABILITIES  # type: ignore[attr-defined]
