"""transformers' continuous batching through the engine tier (``--engine transformers-cb``).

``model.generate_batch`` (transformers >= 4.54) schedules requests over a paged KV cache: prompts
prefilled in chunks of ``max_batch_tokens``, blocks shared between prompts with a common prefix
(``allow_block_sharing``), a cache of ``num_blocks`` pages of ``page_size`` positions. The tier's
options map onto those one to one (``kv_budget``, ``chunked_prefill``, ``prefix_caching``,
``batch``).

What it lacks, declared rather than faked:

- only the chosen token's logprob comes back (``return_logprobs``), no alternatives (no
  ``top_logprobs``) and no prompt logprobs;
- no stop strings, and sampling settings and ``max_new_tokens`` are per call, not per request:
  requests that differ in them go out as separate calls, in order (no ``seed``, no
  ``top_k_top_p``: the tier sends greedy requests only);
- the manager lives for one call: the prefix cache is shared inside a batch, never across calls
  (no ``reset_prefix_cache``, no ``cached_tokens``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from infer_ref.conformance.engines.adapters.transformers_generate import (
    TORCH_DTYPES,
    ends_with_eos,
    generation_eos_ids,
)
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest, TokenLogprobs
from infer_ref.conformance.interface.contract import Unsupported

CAPABILITIES = frozenset(
    {"batch", "chunked_prefill", "kv_budget", "block_size", "prefix_caching", "ignore_eos"}
)
PLAIN_PAGE_SIZE = 32
# Whole prefill for the plain start: a budget no prompt of the tier reaches in one step.
WHOLE_PREFILL_TOKENS = 8192
PLAIN_KV_TOKENS = 8192


class TransformersBatchEngine:
    """An :class:`~infer_ref.conformance.engines.protocol.EngineHandle` over ``model.generate_batch``."""

    capabilities = CAPABILITIES

    def __init__(self, model_dir: Path, options: EngineOptions) -> None:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not _has_generate_batch():
            raise Unsupported(
                f"transformers {transformers.__version__} has no continuous batching (generate_batch)"
            )
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=TORCH_DTYPES[options.dtype], attn_implementation="sdpa"
        ).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos_ids = generation_eos_ids(self.model)
        self.page_size = options.block_size or PLAIN_PAGE_SIZE
        self.batching = _batching_config(options, self.page_size)
        # generate_batch would raise it at its first call
        if (why := _out_of_bounds(self.batching, self.page_size)) is not None:
            raise Unsupported(f"transformers {transformers.__version__} generate_batch: {why}")
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # CPU memory notes on every call
        self.name = (
            f"transformers {transformers.__version__} generate_batch ({options.dtype}, "
            f"page {self.page_size}, {self.batching.num_blocks} pages)"
        )

    @torch.inference_mode()
    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        for i, r in enumerate(requests):
            _check_supported(i, r)
        outputs: list[EngineOutput | None] = [None] * len(requests)
        for group in _groups(requests):
            for i, output in zip(group, self._call([requests[i] for i in group]), strict=True):
                outputs[i] = output
        return [o for o in outputs if o is not None]

    def _call(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        """One ``generate_batch`` for requests that share ``max_tokens`` and ``ignore_eos``."""
        from transformers import GenerationConfig

        first = requests[0]
        eos = [] if first.ignore_eos else self.eos_ids
        config = GenerationConfig(
            max_new_tokens=first.max_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=self.eos_ids[0] if self.eos_ids else 0,
        )
        answers: dict[str, Any] = self.model.generate_batch(
            [list(r.prompt) for r in requests],
            generation_config=config,
            continuous_batching_config=self.batching,
            progress_bar=False,
        )
        # Request ids are req_0, req_1, ... in the order of the inputs.
        return [self._output(r, answers[f"req_{i}"], eos) for i, r in enumerate(requests)]

    def _output(self, request: EngineRequest, answer: Any, eos: list[int]) -> EngineOutput:
        if answer.error is not None:
            raise RuntimeError(f"transformers' continuous batching failed a request: {answer.error}")
        tokens = tuple(int(t) for t in answer.generated_tokens)
        steps = tuple(TokenLogprobs(t, float(lp), ()) for t, lp in zip(tokens, answer.logprobs, strict=True))
        return EngineOutput(
            tokens,
            str(self.tokenizer.decode(list(tokens), skip_special_tokens=True)),
            steps,
            "stop" if ends_with_eos(tokens, eos) else "length",
        )

    def reset_prefix_cache(self) -> None:
        raise Unsupported("transformers' continuous batching keeps no prefix cache across calls")

    def stop(self) -> None:
        pass  # nothing outside this process


def _has_generate_batch() -> bool:
    from transformers import GenerationMixin

    return hasattr(GenerationMixin, "generate_batch")


def _batching_config(options: EngineOptions, page: int) -> Any:
    """The ``ContinuousBatchingConfig`` for ``options``, in the field names of the installed transformers.

    The page size is ``page_size`` from 5.18 on, ``block_size`` before; a field this transformers
    lacks is refused as not supported, naming the version (never a TypeError at the start).
    """
    import dataclasses

    import transformers

    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        raise Unsupported(f"transformers {transformers.__version__} has no ContinuousBatchingConfig") from None
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    settings: dict[str, Any] = {
        "page_size" if "page_size" in fields else "block_size": page,
        "return_logprobs": True,
        "num_blocks": max(1, (options.kv_cache_tokens or PLAIN_KV_TOKENS) // page),
        "max_batch_tokens": options.max_num_batched_tokens or WHOLE_PREFILL_TOKENS,
        "max_requests_per_batch": options.max_num_seqs,
        "allow_block_sharing": options.prefix_caching,
        "use_cuda_graph": False,
    }
    if missing := sorted(set(settings) - fields):
        lacks = ", ".join(missing)
        raise Unsupported(f"transformers {transformers.__version__} ContinuousBatchingConfig has no {lacks}")
    return ContinuousBatchingConfig(**settings)


def _out_of_bounds(config: Any, page: int) -> str | None:
    """What transformers' own bounds check says of ``config`` (a page of fewer than 4 positions, in
    5.24), or None. Before that check existed (5.17) the paged cache refused a small page at the
    first call, by its ``_min_block_size``: that minimum is asked instead."""
    try:
        from transformers.generation.continuous_batching.initialization import check_cb_values_bounds
    except ImportError:
        return _below_cache_minimum(page)
    try:
        check_cb_values_bounds(config)
    except ValueError as e:
        return str(e)
    return None


def _below_cache_minimum(page: int) -> str | None:
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError:
        return None
    minimum = getattr(PagedAttentionCache, "_min_block_size", None)
    if isinstance(minimum, int) and page < minimum:
        return f"page_size must be at least {minimum} (the paged cache's minimum), got {page}"
    return None


def _check_supported(i: int, r: EngineRequest) -> None:
    if not r.greedy:
        raise Unsupported(f"request {i}: sampling settings are per call in generate_batch, not per request")
    if r.stop:
        raise Unsupported(f"request {i}: generate_batch has no stop strings")
    if r.prompt_logprobs is not None:
        raise Unsupported(f"request {i}: generate_batch returns no prompt logprobs")


def _groups(requests: Sequence[EngineRequest]) -> list[list[int]]:
    """Indices of requests that can share a call (same ``max_tokens`` and ``ignore_eos``), in order."""
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((r.max_tokens, r.ignore_eos), []).append(i)
    return list(groups.values())


def start_transformers_batch(model_dir: Path, options: EngineOptions) -> TransformersBatchEngine:
    """``--engine transformers-cb``: ``generate_batch`` on ``model_dir`` in ``options.dtype``."""
    return TransformersBatchEngine(Path(model_dir), options)


start_transformers_batch.capabilities = CAPABILITIES  # type: ignore[attr-defined]
