"""One request: prefill once, then decode one token at a time, through the engine's runner.

``generate()`` is the one-request case of :class:`~infer_ref.engine.runner.ModelRunner` over a
cache of any kind (or none: with ``use_kv_cache=False`` every step re-runs the full sequence,
O(n^2); the two paths must give the same tokens, which is what the suite checks). ``decode="fast"``
(or a :class:`~infer_ref.engine.fast_decoder.FastDecoder`) gives the runner a captured static-shape
step (:mod:`infer_ref.engine.capture`): the prefill runs into its static cache, each decode forward
replays the step, and a greedy request decodes on the device, read back in chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn

from infer_ref.cache.factory import CACHE_KINDS, DEFAULT_BLOCK_SIZE, build_cache
from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.config import ModelConfig
from infer_ref.devices import check_model_device
from infer_ref.engine.runner import ModelRunner
from infer_ref.engine.sequence import Request, model_eos_ids
from infer_ref.errors import UsageError
from infer_ref.results import GenerationResult, TokenDecoder
from infer_ref.sampling import SamplingParams
from infer_ref.validation import check_token_ids, check_tokenizer_decodes, check_tokenizer_fits

if TYPE_CHECKING:
    from infer_ref.engine.fast_decoder import FastDecoder


class InferModel(Protocol):
    """What ``generate`` needs from a model to run it with a KV cache."""

    config: ModelConfig

    def __call__(self, input_ids: Tensor, kv_cache: KVCacheProtocol | None = None) -> Tensor: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...


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

    ``decode="fast"`` runs the decode steps through a captured step (``infer_ref.engine.capture``:
    static cache, one step replayed per token; needs ``use_kv_cache``); pass a ``FastDecoder``
    instead to reuse its cache and captured step across requests.

    Runs where the model is, in its dtype: ``device`` may name the model's device (or be left
    unset); a device that disagrees is refused with a :class:`~infer_ref.errors.UsageError`, never
    moved to. Every argument is checked before any work (token ids in ``[0, vocab_size)``, a
    tokenizer of the model's family, the length); logits that cannot decide a token raise
    :class:`~infer_ref.errors.NonFiniteError` naming the step.

    ``cache`` picks the eager path's KV cache: ``contiguous`` (default), ``static``, ``dynamic`` or
    ``paged`` (blocks of ``block_size`` positions). The tokens must not depend on it.
    """
    device = check_model_device(model, device)
    config = _model_config(model, use_kv_cache)
    tokens = check_request(prompt_token_ids, params, config, tokenizer)
    eos_ids = model_eos_ids(config.eos_token_ids if config is not None else (), tokenizer)

    if cache not in CACHE_KINDS:
        raise ValueError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {cache!r}")
    if decode != "eager" and cache != "contiguous":
        raise ValueError(f"decode={decode!r} runs on its own static cache; cache={cache!r} applies to decode='eager'")
    needed = len(tokens) + params.max_new_tokens
    if decode != "eager":
        runner = _captured_runner(model, decode, use_kv_cache, needed)
        assert runner.capture is not None
        kv_cache: Any = runner.capture.cache
    else:
        runner, kv_cache = _eager_runner(model, config if use_kv_cache else None, cache, needed, block_size)

    request = Request.new(0, tokens, params, tokenizer, eos_ids, on_token=on_token)
    done = runner.take_token(request, runner.prefill(request, tokens, kv_cache))
    if not done and runner.decodes_on_device(request):
        runner.decode_on_device(request)  # to its end: EOS, a stop string or the length limit
        done = True
    while not done:
        [logits] = runner.decode([request], kv_cache, recompute=kv_cache is None)  # [1, V] -> [V]
        done = runner.take_token(request, logits)
    return request.collector.result(request.timing, kv_cache.memory_bytes if kv_cache is not None else None)


def _eager_runner(
    model: nn.Module, config: ModelConfig | None, cache: str, needed: int, block_size: int
) -> tuple[ModelRunner, Any]:
    """The runner and the ``cache`` kind's cache of ``needed`` positions (None without a ``config``:
    no KV cache, every step recomputes the whole sequence)."""
    runner = ModelRunner(model)
    if config is None:
        return runner, None
    kv_cache = build_cache(cache, config, needed, dtype=runner.dtype, device=runner.device, block_size=block_size)
    if runner.device.type == "cuda":
        # On CUDA the static and paged caches decode through their length-aware kernels (the fused
        # decode step, the paged decode kernel): the fast path's attention decides that.
        from infer_ref.fast.modules import use_fast_modules

        use_fast_modules(model)
    return runner, kv_cache


def _captured_runner(model: nn.Module, decode: Any, use_kv_cache: bool, needed: int) -> ModelRunner:
    """``decode="fast"`` (or a ``FastDecoder``): the runner with a captured step of at least
    ``needed`` positions for ``model``, reset for a new request."""
    from infer_ref.engine.capture import CapturedStep

    if not use_kv_cache:
        raise ValueError("decode='fast' needs use_kv_cache=True (the fast path is a cached decode)")
    if decode != "fast" and not isinstance(decode, CapturedStep):
        raise ValueError(f"decode must be 'eager', 'fast' or a FastDecoder, got {decode!r}")
    if not isinstance(decode, CapturedStep):
        capture = CapturedStep(model, needed)
    elif decode.model is not model or decode.max_seq_len < needed:
        raise ValueError(
            f"the FastDecoder passed holds {decode.max_seq_len} positions for another or the same model; "
            f"this request needs {needed} for this model"
        )
    else:
        capture = decode
    capture.reset()
    return ModelRunner(model, capture)
