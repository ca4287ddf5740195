"""The engine tier's options as ``vllm.LLM`` keyword arguments (standard library only).

Shared by the offline worker (``vllm_worker.py``) and the server launcher (``vllm_serve.py``), so
an option means the same in-process and over HTTP.
"""

from __future__ import annotations

import re
from typing import Any

from worker_loop import Refused

CPU_BLOCK_MULTIPLE = 32  # the CPU attention backend's block sizes: MultipleOf(32)
CPU_DEFAULT_BLOCK_SIZE = 128  # what vLLM's CPU platform picks when no block size is given
NULL_BLOCKS = 1  # blocks vLLM's pool reserves and never fills


def llm_kwargs(
    model_dir: str, options: dict[str, Any], *, is_cpu: bool, enforce_eager: bool
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for the tier's options; refuses what vLLM would change silently."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "dtype": options["dtype"],
        "enable_prefix_caching": bool(options["prefix_caching"]),
        # Logprobs of the raw model (log-softmax of the logits before temperature, top-k, top-p),
        # which is what the oracle computes; vLLM's default, stated so that a changed default shows.
        "logprobs_mode": "raw_logprobs",
        "enforce_eager": enforce_eager,
        "distributed_executor_backend": "uni",
        "disable_log_stats": False,  # keeps LLM.get_metrics() (preemptions, prefix-cache hits)
        "seed": 0,
    }
    block_size = options.get("block_size")
    if block_size is not None:
        if is_cpu and block_size % CPU_BLOCK_MULTIPLE:
            raise Refused(
                f"vLLM's CPU backend needs a KV block size that is a multiple of "
                f"{CPU_BLOCK_MULTIPLE}, got {block_size}"
            )
        kwargs["block_size"] = block_size
    budget = options.get("kv_cache_tokens")
    if budget is not None:
        groups = kv_cache_groups(_layer_types(model_dir))
        kwargs["num_gpu_blocks_override"] = _kv_blocks(budget * groups, block_size, is_cpu=is_cpu)
    if options.get("max_num_batched_tokens") is not None:
        kwargs["max_num_batched_tokens"] = options["max_num_batched_tokens"]
        kwargs["enable_chunked_prefill"] = True
    for name in ("max_num_seqs", "max_model_len"):
        if options.get(name) is not None:
            kwargs[name] = options[name]
    return kwargs


def _layer_types(model_dir: str) -> list[str]:
    """Each layer's attention type as transformers reads config.json (both styles): vLLM's own reading."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    config = getattr(config, "text_config", config)
    return list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)


def kv_cache_groups(layer_types: list[str]) -> int:
    """How many KV cache groups vLLM's hybrid allocator makes for these layers.

    Every group takes its own blocks from the one pool for every request, so a budget of T
    positions for each request's layers takes T * groups positions of blocks. vLLM groups layers
    of one attention type into groups of equal size, the size being the smallest type's layer count
    (the largest's when it is under 1.5 times the smallest): Gemma 3's S S F S is 4 groups of 1.
    """
    counts = [layer_types.count(t) for t in dict.fromkeys(layer_types)]
    if len(counts) == 1:
        return 1
    size = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    return sum(-(-c // size) for c in counts)


def _kv_blocks(tokens: int, block_size: int | None, *, is_cpu: bool) -> int:
    """vLLM bounds its KV cache in blocks (``num_gpu_blocks_override``, honoured on CPU too).

    One more block than the budget holds: vLLM keeps its first block as a placeholder (the "null
    block" of its block pool) that never holds a position, so N blocks hold (N - 1) * block_size.
    """
    if block_size is None:
        if not is_cpu:
            raise Refused("a KV budget (kv_cache_tokens) needs an explicit block_size on this vLLM platform")
        block_size = CPU_DEFAULT_BLOCK_SIZE
    if tokens % block_size:
        raise Refused(
            f"vLLM holds whole KV blocks: kv_cache_tokens={tokens} is not a multiple of "
            f"the block size {block_size}"
        )
    return tokens // block_size + NULL_BLOCKS


# vLLM's own refusal of a dtype for a model type, in its ModelConfig's validation error: "The model
# type 'gemma3_text' does not support float16. Reason: Numerical instability. ..."
_DECLINED = re.compile(
    r"The model type '[^']+' does not support (float16|bfloat16)[^.]*\.(?: Reason: [^.]*\.)?"
)


def declined_dtype(error_text: str, dtype: str) -> str | None:
    """vLLM's sentence declining ``dtype`` for the model, when ``error_text`` (a start failure) is
    that refusal; None for any other failure."""
    found = _DECLINED.search(error_text)
    return found.group(0) if found is not None and found.group(1) == dtype else None
