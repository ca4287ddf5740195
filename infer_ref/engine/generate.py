"""The generation loop: prefill once, then decode one token at a time.

With ``use_kv_cache=False`` every step re-runs the full sequence (O(n^2)); the two paths must give
the same tokens, which is what the suite checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn

from infer_ref.cache.factory import CACHE_KINDS, DEFAULT_BLOCK_SIZE, build_cache
from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.config import ModelConfig
from infer_ref.devices import resolve as resolve_device
from infer_ref.engine.result import (
    GenerationResult,
    GenerationTiming,
    TokenCollector,
    TokenDecoder,
)
from infer_ref.engine.sampling import SamplingParams, sample_token
from infer_ref.errors import UsageError
from infer_ref.validation import check_token_ids, check_tokenizer_decodes, check_tokenizer_fits

if TYPE_CHECKING:
    from infer_ref.engine.fast_decode import FastDecoder



class InferModel(Protocol):
    """What ``generate`` needs from a model to run it with a KV cache."""

    config: ModelConfig

    def __call__(self, input_ids: Tensor, kv_cache: KVCacheProtocol | None = None) -> Tensor: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model_config(model: nn.Module, use_kv_cache: bool) -> ModelConfig | None:
    config = getattr(model, "config", None)
    if config is None and use_kv_cache:
        raise TypeError(
            "model must have a .config attribute (a ModelConfig) for KV cache allocation; "
            "pass use_kv_cache=False to run without a cache"
        )
    return config


def check_request(
    prompt_token_ids: Sequence[int] | Tensor, params: SamplingParams, config: ModelConfig | None, tokenizer: object
) -> list[int]:
    """The prompt as a list of ints, after every check that needs no model run (before any work)."""
    if not isinstance(params, SamplingParams):
        raise UsageError(f"params must be a SamplingParams, got {type(params).__name__}")
    ids: Tensor | Sequence[int] = prompt_token_ids
    check_tokenizer_decodes(tokenizer)
    if isinstance(ids, Tensor) and ids.dim() != 1:
        raise UsageError(f"prompt_token_ids must be 1-D, got shape {tuple(ids.shape)}")
    vocab_size = config.vocab_size if config is not None else 2**63 - 1  # without a config: integers only
    check_token_ids(ids, vocab_size, name="prompt_token_ids")
    tokens = [int(t) for t in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    if config is not None:
        check_tokenizer_fits(tokenizer, config.model_type, config.vocab_size)
    _check_length(len(tokens), params, config)
    return tokens


def _check_length(prompt_len: int, params: SamplingParams, config: ModelConfig | None) -> None:
    if prompt_len == 0:
        raise UsageError("prompt_token_ids is empty: generation needs at least one prompt token")
    if config is not None and prompt_len + params.max_new_tokens > config.max_position_embeddings:
        raise UsageError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({params.max_new_tokens}) = "
            f"{prompt_len + params.max_new_tokens} exceeds the model's max_position_embeddings "
            f"({config.max_position_embeddings})"
        )


@torch.inference_mode()
def generate(
    model: nn.Module,
    tokenizer: TokenDecoder,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    device: str | torch.device | None = None,
    use_kv_cache: bool = True,
    on_token: Callable[[int], None] | None = None,
    decode: Literal["eager", "fast"] | FastDecoder = "eager",
    cache: str = "contiguous",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> GenerationResult:
    """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``.

    Stops at any EOS id of the model config (or the tokenizer's ``eos_token_ids``), at a stop
    string, or at the length limit. ``on_token`` is called with each token as it is chosen.

    ``decode="fast"`` runs the decode steps through ``infer_ref.engine.fast_decode`` (static
    cache, one captured step replayed per token; needs ``use_kv_cache``); pass a ``FastDecoder``
    instead to reuse its cache and captured step across requests.

    ``device`` defaults to CUDA when available, else the CPU. Every argument is checked before any
    work (token ids in ``[0, vocab_size)``, a tokenizer of the model's family, the length); logits
    that cannot decide a token raise :class:`~infer_ref.errors.NonFiniteError` naming the step.

    ``cache`` picks the eager path's KV cache: ``contiguous`` (default), ``static``, ``dynamic`` or
    ``paged`` (blocks of ``block_size`` positions). The tokens must not depend on it.
    """
    device = resolve_device(device)
    config = _model_config(model, use_kv_cache)
    tokens = check_request(prompt_token_ids, params, config, tokenizer)
    eos_ids = set(config.eos_token_ids if config is not None else ()) | set(getattr(tokenizer, "eos_token_ids", ()))

    if cache not in CACHE_KINDS:
        raise ValueError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {cache!r}")
    if decode != "eager" and cache != "contiguous":
        raise ValueError(f"decode={decode!r} runs on its own static cache; cache={cache!r} applies to decode='eager'")
    if decode != "eager":
        from infer_ref.engine.fast_decode import FastDecoder, generate_fast

        if not use_kv_cache:
            raise ValueError("decode='fast' needs use_kv_cache=True (the fast path is a cached decode)")
        if decode != "fast" and not isinstance(decode, FastDecoder):
            raise ValueError(f"decode must be 'eager', 'fast' or a FastDecoder, got {decode!r}")
        return generate_fast(
            model,
            tokenizer,
            tokens,
            params,
            device=device,
            decoder=decode if isinstance(decode, FastDecoder) else None,
            on_token=on_token,
            eos_ids=eos_ids,
        )

    kv_cache: Any = None
    if use_kv_cache:
        assert config is not None
        kv_cache = build_cache(
            cache,
            config,
            len(tokens) + params.max_new_tokens,
            dtype=next(model.parameters()).dtype,
            device=device,
            block_size=block_size,
        )

    collector = TokenCollector(
        tokens, tokenizer, max_new_tokens=params.max_new_tokens, stop=params.stop, eos_ids=eos_ids, on_token=on_token
    )
    generator = params.make_generator()
    timing = GenerationTiming()
    done = False
    while not done:
        step = len(collector.generated)
        fed = collector.tokens if kv_cache is None or step == 0 else collector.tokens[-1:]
        input_ids = torch.tensor([fed], dtype=torch.long, device=device)  # [1, T]
        _sync(device)
        t0 = time.perf_counter()
        logits = model(input_ids, kv_cache=kv_cache)  # [1, T or 1, V]
        _sync(device)
        elapsed = time.perf_counter() - t0
        if step == 0:
            timing.prefill_time_s = elapsed
        else:
            timing.decode_times_s.append(elapsed)
        where = f"step {step} (position {len(collector.tokens) - 1})"
        done = collector.accept(sample_token(logits[0, -1, :], collector.tokens, params, generator, where=where))

    return collector.result(timing, kv_cache.memory_bytes if kv_cache is not None else None)
