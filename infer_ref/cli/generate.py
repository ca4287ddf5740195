"""``infer-ref generate [PROMPT]``: one prompt through ``generate()``, streamed, then its metrics.

Several prompts or a shared ``--system`` prompt go to the engine instead (``generate_engine``).
Every argument is checked before the model is loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import TYPE_CHECKING, Any

from infer_ref.cache.kinds import CACHE_KINDS
from infer_ref.cli.generate_engine import (
    add_engine_arguments,
    collect_prompts,
    encode_prompts,
    print_engine_summary,
    run_engine,
    wants_engine,
)
from infer_ref.cli.options import (
    DEFAULT_MODEL,
    DTYPES,
    UsageError,
    check_device,
    default_dtype,
    resolve_device,
    resolve_model,
    run_labels,
)
from infer_ref.device_names import check_device_name
from infer_ref.paths import require_snapshot
from infer_ref.sampling_params import SamplingParams

if TYPE_CHECKING:  # the library and torch load when the command runs, not to parse its arguments
    from infer_ref.engine.generate import GenerationResult

DEFAULT_PROMPT = "Count to ten."

# Checkpoints smaller than this have every weight checked for NaN/inf on load unless --no-check-weights
# (a fraction of a second for the fixtures; a pass over every weight of a multi-GB model is not free).
CHECK_WEIGHTS_BELOW_BYTES = 2 * 2**30
# Torch's default intra-op threads (one per core) make a tiny model's decode step slower, not faster:
# every small op pays the thread pool's hand-off, and on a busy machine a wait for a core. llama-tiny
# on a loaded 2-core machine: 24-26 decode tok/s with torch's default 2 threads, 415-439 with one.
# Models up to this many parameters run on one thread unless --threads says otherwise.
SINGLE_THREAD_BELOW_PARAMS = 50_000_000


def add_generate_command(commands: argparse._SubParsersAction) -> None:
    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", nargs="?", default=None, help=f"prompt text (default: {DEFAULT_PROMPT!r})")
    gen.add_argument("--model", default=DEFAULT_MODEL,
                     help="snapshot folder, fixture name (llama-tiny, qwen3-tiny, gemma3-tiny), or a name under "
                          "$INFER_REF_MODELS (default: the embedded llama-tiny)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                     help="wrap the prompt in the model's chat template (default: on)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--kv-cache", action=argparse.BooleanOptionalAction, default=True,
                     help="use the KV cache (default) or recompute the full sequence every step")
    gen.add_argument("--cache", default="contiguous", choices=list(CACHE_KINDS),
                     help="KV cache of the eager path: contiguous (default), static (fixed buffers, device-side "
                          "position), dynamic (grows by concatenation) or paged (blocks of --block-size)")
    gen.add_argument("--fast", action="store_true",
                     help="decode with the captured static-shape step (CUDA graph on CUDA; same tokens as eager)")
    gen.add_argument("--compile", action="store_true",
                     help="with --fast on CUDA: torch.compile the step before capturing it (fastest; ~1 min to compile)")
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    gen.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                     help="default: bfloat16 on CUDA, float32 on CPU")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_engine_arguments(gen)
    gen.add_argument("--check-weights", action=argparse.BooleanOptionalAction, default=None,
                     help="refuse a checkpoint holding NaN/inf weights (default: on below 2 GiB of safetensors)")
    gen.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: 1 for models under 50M parameters, else torch's default)")
    gen.set_defaults(run=_generate)


def _generate(args: argparse.Namespace) -> int:
    # Every argument, the prompts file and the model's folder are checked before torch is imported.
    _check_options(args)
    engine_texts = collect_prompts(args) if wants_engine(args) else None
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            seed=args.seed, max_new_tokens=args.max_new_tokens)  # a UsageError names the field
    folder = resolve_model(args.model)
    require_snapshot(folder, "--model")
    check_device(args.device)
    from infer_ref.loader import checkpoint_bytes, load_model
    from infer_ref.tokenizer import Tokenizer

    device = resolve_device(args.device)
    dtype = default_dtype(args.dtype, device)
    check_weights = args.check_weights
    if check_weights is None:
        check_weights = checkpoint_bytes(folder) < CHECK_WEIGHTS_BELOW_BYTES
    model, config = load_model(folder, dtype=dtype, device=device, check_weights=check_weights)
    tokenizer = Tokenizer(folder)
    _set_threads(args.threads, model)
    if engine_texts is not None:
        prompts = encode_prompts(engine_texts, args.system, tokenizer, config.model_type, args.chat)
        summary = run_engine(args, model, tokenizer, config, params, prompts, device, dtype, folder)
        print_engine_summary(summary, args.json)
        return 0
    text = DEFAULT_PROMPT if args.prompt is None else args.prompt
    [prompt_ids] = encode_prompts([text], None, tokenizer, config.model_type, args.chat)
    summary = _generate_one(args, model, tokenizer, config, params, prompt_ids, run_labels(folder, config, device, dtype))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print()
        print(_metrics_block(summary))
    return 0


def _generate_one(args: argparse.Namespace, model: Any, tokenizer: Any, config: Any, params: Any,
                  prompt_ids: list[int], labels: dict[str, str]) -> dict[str, Any]:
    """One prompt through ``generate()`` (streamed unless --json); its summary after the run's ``labels``."""
    from infer_ref.engine import generate

    needed = len(prompt_ids) + params.max_new_tokens
    if needed > config.max_position_embeddings:
        raise UsageError(
            f"prompt of {len(prompt_ids)} tokens + --max-new-tokens {params.max_new_tokens} = {needed} exceeds "
            f"the model's context of {config.max_position_embeddings} positions"
        )
    stream = None if args.json else _Streamer(tokenizer)
    decode = _decode_mode(args, model, needed)
    result = generate(model, tokenizer, prompt_ids, params, use_kv_cache=args.kv_cache,
                      on_token=stream.push if stream else None, decode=decode, cache=args.cache,
                      block_size=args.block_size)
    mode = "compiled" if args.compile else "fast" if args.fast else "eager"
    cache = "static (fast path)" if args.fast else args.cache if args.kv_cache else "off"
    return _summary(result, labels, args.kv_cache, mode, cache)


def _set_threads(threads: int | None, model: Any) -> None:
    """``--threads``, or one thread for a tiny model (see :data:`SINGLE_THREAD_BELOW_PARAMS`)."""
    if threads is None:
        params = sum(p.numel() for p in model.parameters())
        threads = 1 if params < SINGLE_THREAD_BELOW_PARAMS else None
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _check_options(args: argparse.Namespace) -> None:
    """The options alone and how they combine: refused before anything is read or imported."""
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be a positive integer, got {args.threads}")
    if args.fast and args.cache != "contiguous":
        raise UsageError(f"--fast decodes through its own static cache: it cannot be combined with --cache {args.cache}")
    if not args.kv_cache and args.cache != "contiguous":
        raise UsageError(f"--no-kv-cache runs without a cache: it cannot be combined with --cache {args.cache}")
    if args.block_size < 1:
        raise UsageError(f"--block-size must be a positive integer, got {args.block_size}")
    if args.fast and not args.kv_cache:
        raise UsageError("--fast decodes through a static KV cache: it cannot be combined with --no-kv-cache")
    if args.compile and not args.fast:
        raise UsageError("--compile compiles the fast decode step: add --fast")
    if args.compile and args.device is not None and check_device_name(args.device) == "cpu":
        raise UsageError(f"--compile needs a CUDA device (the compiled step is captured in a CUDA graph), got {args.device}")


def _decode_mode(args: argparse.Namespace, model: Any, needed: int) -> Any:
    """``generate``'s ``decode`` argument for --fast / --compile (the options checked by :func:`_check_options`)."""
    if not args.compile:
        return "fast" if args.fast else "eager"
    from infer_ref.devices import model_placement

    device, _ = model_placement(model)
    if device.type != "cuda":
        raise UsageError(f"--compile needs a CUDA device (the compiled step is captured in a CUDA graph), got {device}")
    from infer_ref.engine import FastDecoder

    return FastDecoder(model, needed, device=device, compile=True)


class _Streamer:
    """Prints the text of each new token as it arrives (decoding the whole tail keeps multi-byte text intact)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.printed = ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.printed):])
            sys.stdout.flush()
            self.printed = text


def _summary(result: GenerationResult, labels: dict[str, str], use_kv_cache: bool, decode: str,
             cache: str) -> dict[str, Any]:
    timing = result.timing
    forwards_ms = [timing.prefill_time_s * 1e3] + [t * 1e3 for t in timing.decode_times_s]
    decode_s = timing.decode_time_s
    return {
        **labels,
        "use_kv_cache": use_kv_cache,
        "cache": cache,
        "decode": decode,
        "prompt_tokens": result.prompt_tokens,
        "generated_tokens": result.generated_tokens,
        "finish_reason": result.finish_reason,
        "text": result.text,
        "token_ids": result.token_ids,
        "metrics": {
            "time_to_first_token_ms": round(timing.prefill_time_s * 1e3, 3),
            "decode_tokens_per_second": round(len(timing.decode_times_s) / decode_s, 3) if decode_s > 0 else None,
            "per_forward_ms": {
                "min": round(min(forwards_ms), 3),
                "max": round(max(forwards_ms), 3),
                "mean": round(statistics.fmean(forwards_ms), 3),
                "n": len(forwards_ms),
            },
            "cache_memory_mb": round(result.cache_memory_bytes / 2**20, 3) if result.cache_memory_bytes else None,
        },
    }


def _metrics_block(summary: dict[str, Any]) -> str:
    m = summary["metrics"]
    pf = m["per_forward_ms"]
    cache = f"{m['cache_memory_mb']:.3f} MiB" if m["cache_memory_mb"] is not None else "off"
    tps = f"{m['decode_tokens_per_second']:.3f}" if m["decode_tokens_per_second"] is not None else "n/a"
    return "\n".join([
        f"finish: {summary['finish_reason']} after {summary['generated_tokens']} tokens "
        f"({summary['model_type']}, {summary['dtype']}, {summary['device']})",
        f"kv cache: {summary['cache']}, {cache}",
        "metrics:",
        f"  time_to_first_token_ms: {m['time_to_first_token_ms']:.3f}",
        f"  decode_tokens_per_second: {tps}",
        f"  per_forward_ms: min {pf['min']:.3f}  max {pf['max']:.3f}  mean {pf['mean']:.3f}  (n={pf['n']})",
    ])

