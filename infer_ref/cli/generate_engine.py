"""``infer-ref generate`` with several prompts: the multi-request engine behind the command.

Several prompts (``--prompt`` repeated, ``--prompts-file`` with one prompt per line) and an
optional ``--system`` prompt shared by all of them run through :class:`infer_ref.Engine`: one paged
pool, prefix caching (the shared system prompt is prefilled once), batched decode. The command
prints each request's output, then the prefix hit rate, blocks used and throughput.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer_ref.cli.options import UsageError, run_labels

if TYPE_CHECKING:  # the engine and torch load when the command runs, not to parse its arguments
    import torch

    from infer_ref.engine.engine import Engine, EngineResult, EngineStats


class EngineUsageError(UsageError):
    """A bad combination of the multi-prompt options (a usage error: exit status 2)."""


def add_engine_arguments(gen: argparse.ArgumentParser) -> None:
    group = gen.add_argument_group("several prompts (the multi-request engine)")
    group.add_argument("--prompt", dest="prompts", action="append", default=None, metavar="TEXT",
                       help="a prompt; repeat for several (runs them together through the engine)")
    group.add_argument("--prompts-file", type=Path, default=None, metavar="FILE",
                       help="prompts, one per line (blank lines skipped)")
    group.add_argument("--system", default=None, metavar="TEXT",
                       help="a system prompt shared by every prompt (prefilled once with prefix caching)")
    group.add_argument("--block-size", type=int, default=16,
                       help="positions per KV block, of --cache paged and of the engine's pool (default 16)")
    group.add_argument("--num-blocks", type=int, default=None,
                       help="blocks in the pool (default: enough for every request at once)")
    group.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    group.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="share full blocks between requests by chained hashes (default: on)")


def wants_engine(args: argparse.Namespace) -> bool:
    """Several prompts or a shared system prompt: run through the engine."""
    return bool(args.prompts or args.prompts_file or args.system is not None)


def collect_prompts(args: argparse.Namespace) -> list[str]:
    """The prompt texts, in order: the positional prompt, every ``--prompt``, then the file's lines."""
    if args.fast or args.compile or not args.kv_cache or args.cache not in ("contiguous", "paged"):
        raise EngineUsageError(
            "--fast, --compile, --no-kv-cache and --cache apply to one prompt; the engine always uses its paged cache"
        )
    for name in ("block_size", "max_batch", "num_blocks"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise EngineUsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    texts = [args.prompt] if args.prompt is not None else []
    texts += args.prompts or []
    if args.prompts_file is not None:
        if not args.prompts_file.is_file():
            raise FileNotFoundError(f"--prompts-file {args.prompts_file}: no such file (expected one prompt per line)")
        texts += [line.strip() for line in args.prompts_file.read_text().splitlines() if line.strip()]
    if not texts:
        raise EngineUsageError("--system needs at least one prompt (positional, --prompt or --prompts-file)")
    return texts


def encode_prompts(texts: list[str], system: str | None, tokenizer: Any, model_type: str, chat: bool) -> list[list[int]]:
    """Token ids of each request: the chat template with the shared system turn, or plain text."""
    from infer_ref.chat import render_chat_template

    out = []
    for text in texts:
        if chat:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]
            options = {"enable_thinking": False} if model_type == "qwen3" else {}
            out.append(tokenizer.encode(render_chat_template(messages, model_type, **options), add_special_tokens=False))
        else:
            out.append(tokenizer.encode(text if system is None else f"{system}\n{text}"))
    return out


def default_num_blocks(prompt_ids: list[list[int]], max_new_tokens: int, block_size: int) -> int:
    """Blocks for every request at once, with no sharing: the pool never runs out."""
    return sum(-(-(len(p) + max_new_tokens - 1) // block_size) for p in prompt_ids)


def run_engine(args: argparse.Namespace, model: Any, tokenizer: Any, config: Any, params: Any,
               prompt_ids: list[list[int]], device: torch.device, dtype: torch.dtype, folder: Path) -> dict[str, Any]:
    """Run the requests; the summary the command prints (or dumps with --json)."""
    from infer_ref.engine.engine import Engine

    num_blocks = args.num_blocks if args.num_blocks is not None else default_num_blocks(prompt_ids, params.max_new_tokens, args.block_size)
    try:
        engine = Engine(model, tokenizer, num_blocks=num_blocks, block_size=args.block_size,
                        enable_prefix_caching=args.prefix_caching, max_batch=args.max_batch)
        results = engine.generate(prompt_ids, params)
    except ValueError as err:
        raise EngineUsageError(str(err)) from None
    return engine_summary(results, engine.stats, engine, run_labels(folder, config, device, dtype))


def engine_summary(results: list[EngineResult], stats: EngineStats, engine: Engine, labels: dict[str, str]) -> dict[str, Any]:
    prefix = stats.prefix
    return {
        **labels,
        "engine": {
            "num_blocks": engine.pool.num_blocks,
            "block_size": engine.block_size,
            "max_batch": engine.max_batch,
            "prefix_caching": engine.enable_prefix_caching,
        },
        "requests": [
            {
                "prompt_tokens": r.prompt_tokens,
                "num_cached_tokens": r.num_cached_tokens,
                "generated_tokens": r.generated_tokens,
                "finish_reason": r.finish_reason,
                "preemptions": r.num_preemptions,
                "text": r.text,
                "token_ids": r.token_ids,
            }
            for r in results
        ],
        "metrics": {
            "prefix_hit_rate": round(prefix.hit_rate, 4),
            "cached_prompt_tokens": prefix.cached_tokens,
            "prompt_tokens": prefix.prompt_tokens,
            "prefill_tokens_computed": stats.prefill_tokens_computed,
            "peak_blocks_used": stats.peak_blocks_used,
            "peak_cache_mb": round(stats.peak_blocks_used * engine.pool.bytes_per_block / 2**20, 3),
            "preemptions": stats.preemptions,
            "decode_steps": stats.decode_steps,
            "generated_tokens": stats.generated_tokens,
            "wall_time_s": round(stats.wall_time_s, 4),
            "tokens_per_second": round(stats.tokens_per_s, 3),
        },
    }


def format_engine_summary(summary: dict[str, Any]) -> str:
    lines = []
    for i, r in enumerate(summary["requests"]):
        lines.append(f"[{i}] {r['text']}")
        lines.append(
            f"    finish: {r['finish_reason']} after {r['generated_tokens']} tokens; prompt {r['prompt_tokens']} tokens, "
            f"{r['num_cached_tokens']} from the prefix cache" + (f"; preempted {r['preemptions']}x" if r["preemptions"] else "")
        )
    m, e = summary["metrics"], summary["engine"]
    lines += [
        f"engine: {len(summary['requests'])} requests ({summary['model_type']}, {summary['dtype']}, {summary['device']}), "
        f"{e['num_blocks']} blocks of {e['block_size']}, max batch {e['max_batch']}, "
        f"prefix caching {'on' if e['prefix_caching'] else 'off'}",
        "metrics:",
        f"  prefix_hit_rate: {m['prefix_hit_rate']:.4f} ({m['cached_prompt_tokens']} of {m['prompt_tokens']} prompt tokens cached)",
        f"  prefill_tokens_computed: {m['prefill_tokens_computed']}",
        f"  peak_blocks_used: {m['peak_blocks_used']} of {e['num_blocks']} ({m['peak_cache_mb']:.3f} MiB)",
        f"  preemptions: {m['preemptions']}",
        f"  throughput: {m['tokens_per_second']:.3f} tokens/s ({m['generated_tokens']} tokens in {m['wall_time_s']:.3f} s, "
        f"{m['decode_steps']} batched decode steps)",
    ]
    return "\n".join(lines)


def print_engine_summary(summary: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(summary, indent=2) if as_json else format_engine_summary(summary))
