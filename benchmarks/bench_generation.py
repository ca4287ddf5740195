"""Generation benchmark: prefill and decode timing, cached vs uncached, eager vs fast.

Examples:
    python benchmarks/bench_generation.py --model llama-tiny --compare                 # CPU, fixture
    python benchmarks/bench_generation.py --model llama-3.2-1b --device cuda --compare --decode fast \\
        --prompt-len 512 --new-tokens 256 --json out.json --plot latency.png

``--compare`` runs the cached and uncached generation back to back in one process and reports the
speedup ratio; ``--decode fast`` also runs the fast decode path (static cache, captured step).
Models: fixture checkpoints (``llama-tiny``...), snapshot paths, real-shape synthetic models
(``llama-3.2-1b``, ``qwen3-1.7b``, ``gemma-3-1b-it``; use them on CUDA) or ``tiny-<family>``.
EOS is ignored so that every run generates exactly ``--new-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import (
    DTYPES,
    NullDecoder,
    environment,
    load_bench_model,
    median,
    memory_now_bytes,
    memory_peak_bytes,
    percentile,
    pick_device,
    reset_peak,
    sync,
)
from infer_ref.cache.factory import CACHE_KINDS
from infer_ref.engine import FastDecoder
from infer_ref.engine.generate import GenerationResult, generate
from infer_ref.sampling import SamplingParams


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (length,), generator=gen).tolist()


def run_config(
    model: torch.nn.Module,
    prompt: list[int],
    new_tokens: int,
    device: torch.device,
    *,
    use_kv_cache: bool,
    decode: str,
    warmup: int,
    repeats: int,
    compile: bool = False,
    cache: str = "contiguous",
    block_size: int = 16,
) -> dict[str, Any]:
    """Warm up, then time ``repeats`` generations; every statistic is over the timed runs."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    mode: Any = "eager"
    if decode == "fast":
        mode = FastDecoder(model, len(prompt) + new_tokens, device=device, compile=compile)
    options: dict[str, Any] = {"device": device, "use_kv_cache": use_kv_cache, "decode": mode}
    if use_kv_cache and decode == "eager":
        options |= {"cache": cache, "block_size": block_size}
    for _ in range(warmup):
        generate(model, NullDecoder(), prompt, params, **options)
    sync(device)
    reset_peak(device)
    runs: list[GenerationResult] = [generate(model, NullDecoder(), prompt, params, **options) for _ in range(repeats)]
    ttfts = [r.timing.prefill_time_s for r in runs]
    decode_totals = [r.timing.decode_time_s for r in runs]
    steps = [t for r in runs for t in r.timing.decode_times_s]
    n_decode = len(runs[0].timing.decode_times_s)
    # Per-position latency: the median over repeats at each decode step.
    by_position = [median([r.timing.decode_times_s[i] for r in runs]) for i in range(n_decode)]
    cache_bytes = runs[0].cache_memory_bytes
    return {
        "use_kv_cache": use_kv_cache,
        "cache": (cache if decode == "eager" else "static") if use_kv_cache else "none",
        "block_size": block_size if use_kv_cache and cache == "paged" and decode == "eager" else None,
        "decode": decode if use_kv_cache else "uncached",
        "compiled": compile,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "warmup": warmup,
        "repeats": repeats,
        "ttft_s_median": median(ttfts),
        "prompt_tokens_per_s": len(prompt) / median(ttfts),
        "decode_time_s_median": median(decode_totals),
        "decode_tokens_per_s": n_decode / median(decode_totals) if n_decode else float("nan"),
        "step_latency_s": {
            "mean": sum(steps) / len(steps) if steps else float("nan"),
            "p50": percentile(steps, 50),
            "p95": percentile(steps, 95),
            "p99": percentile(steps, 99),
            "min": min(steps, default=float("nan")),
            "max": max(steps, default=float("nan")),
        },
        "step_latency_by_position_s": by_position,
        "first_decode_position": len(prompt) + 1,
        "cache_memory_mb": cache_bytes / 1e6 if cache_bytes is not None else None,
        "peak_memory_mb": memory_peak_bytes(device) / 1e6,
        "tokens_equal_across_repeats": all(r.token_ids == runs[0].token_ids for r in runs),
        "token_ids": runs[0].token_ids,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_report(report: dict[str, Any]) -> str:
    lines = ["=== Generation Benchmark ==="]
    m, env = report["model"], report["environment"]
    lines += [
        f"Model:            {m['name']} ({m['source']})",
        f"Parameters:       {m['parameters'] / 1e6:.1f} M",
        f"Device:           {env['device_name']} ({env['device']}); torch {env['torch']}, transformers {env['transformers']}",
        f"Dtype:            {report['dtype']}",
        f"Prompt / new:     {report['prompt_tokens']} / {report['new_tokens']} tokens",
    ]
    for run in report["runs"]:
        kind = "enabled" if run["use_kv_cache"] else "disabled"
        if run["use_kv_cache"]:
            kind += f" ({run['cache']}, {run['cache_memory_mb']:.1f} MB), decode={run['decode']}{' +compile' if run['compiled'] else ''}"
        s = run["step_latency_s"]
        lines += [
            "",
            f"KV Cache:         {kind}",
            "--- Prefill ---",
            f"TTFT (median):    {_ms(run['ttft_s_median'])}",
            f"Prompt throughput: {run['prompt_tokens_per_s']:.0f} tok/s",
            "--- Decode ---",
            f"Total decode time (median):  {run['decode_time_s_median']:.3f} s",
            f"Decode throughput (median):  {run['decode_tokens_per_s']:.1f} tok/s",
            "Per-step latency:",
            f"  Mean:           {_ms(s['mean'])}",
            f"  P50:            {_ms(s['p50'])}",
            f"  P95:            {_ms(s['p95'])}",
            f"  P99:            {_ms(s['p99'])}",
            f"  Min:            {_ms(s['min'])}",
            f"  Max:            {_ms(s['max'])}",
            "--- Memory ---",
            f"Post-load:        {report['post_load_memory_mb']:.1f} MB",
            f"Cache memory:     {run['cache_memory_mb']:.1f} MB" if run["cache_memory_mb"] else "Cache memory:     none",
            f"Peak:             {run['peak_memory_mb']:.1f} MB",
        ]
    if "speedup" in report:
        lines += ["", "--- Comparison (same process, back to back) ---"]
        for key, value in report["speedup"].items():
            lines.append(f"{key}: {value:.2f}x")
    if "tokens_equal" in report:
        lines.append(f"Same tokens on every path: {report['tokens_equal']}")
    return "\n".join(lines)


def plot_latency(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in report["runs"]:
        ys = [t * 1e3 for t in run["step_latency_by_position_s"]]
        xs = list(range(run["first_decode_position"], run["first_decode_position"] + len(ys)))
        label = "uncached" if not run["use_kv_cache"] else f"{run['cache']} cache, {run['decode']}{' +compile' if run['compiled'] else ''}"
        ax.plot(xs, ys, label=label, linewidth=1)
    ax.set_xlabel("sequence position of the decode step")
    ax.set_ylabel("step latency (ms, median over repeats)")
    ax.set_yscale("log")
    env = report["environment"]
    ax.set_title(f"{report['model']['name']} · {report['dtype']} · {env['device_name']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-tiny", help="fixture name, snapshot path, real-shape name or tiny-<family>")
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda when present)")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    cache = ap.add_mutually_exclusive_group()
    cache.add_argument("--kv-cache", dest="kv_cache", action="store_true", default=True, help="use the KV cache (default)")
    cache.add_argument("--no-kv-cache", dest="kv_cache", action="store_false", help="re-run the full sequence each step")
    ap.add_argument("--compare", action="store_true", help="run cached and uncached, report the speedup")
    ap.add_argument("--decode", choices=["eager", "fast", "both"], default="eager", help="cached decode path(s)")
    ap.add_argument("--compile", action="store_true", help="fast path: torch.compile the captured step (CUDA)")
    ap.add_argument("--cache", nargs="+", default=["contiguous"], choices=list(CACHE_KINDS),
                    help="cache type(s) of the eager cached path, run side by side (default: contiguous)")
    ap.add_argument("--block-size", type=int, default=16, help="positions per block of the paged cache")
    ap.add_argument("--json", type=Path, help="write the JSON report here")
    ap.add_argument("--plot", type=Path, help="write a PNG of per-step latency against position here")
    args = ap.parse_args(argv)

    device = pick_device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    torch.manual_seed(args.seed)
    model, info, _ = load_bench_model(args.model, device, dtype, seed=args.seed)
    sync(device)
    post_load = memory_now_bytes(device)
    prompt = prompt_ids(model.config.vocab_size, args.prompt_len, args.seed)

    plan: list[tuple[bool, str, str]] = []  # (use the cache, decode path, cache type of the eager path)
    cached_paths = ["eager", "fast"] if args.decode == "both" else [args.decode]
    if args.kv_cache or args.compare:
        for d in cached_paths:
            plan += [(True, d, c) for c in (args.cache if d == "eager" else ["static"])]
    if not args.kv_cache or args.compare:
        plan.append((False, "eager", "none"))

    runs = []
    for use_cache, decode, cache_kind in plan:
        label = f"cached/{decode}/{cache_kind}" if use_cache else "uncached"
        print(f"[bench] {args.model}: {label} ...", file=sys.stderr, flush=True)
        runs.append(
            run_config(
                model, prompt, args.new_tokens, device, use_kv_cache=use_cache, decode=decode,
                warmup=args.warmup, repeats=args.repeats, compile=args.compile and decode == "fast",
                cache=cache_kind, block_size=args.block_size,
            )
        )

    report: dict[str, Any] = {
        "phase": 3,
        "model": info,
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_tokens": args.prompt_len,
        "new_tokens": args.new_tokens,
        "use_kv_cache": runs[0]["use_kv_cache"],
        "cache_memory_mb": runs[0]["cache_memory_mb"],
        "post_load_memory_mb": post_load / 1e6,
        "environment": environment(device),
        "runs": runs,
    }
    # Comparisons use the first cache type of each decode path (contiguous unless --cache says otherwise).
    by_kind: dict[str, dict[str, Any]] = {}
    for r in runs:
        by_kind.setdefault(r["decode"], r)
    if "uncached" in by_kind and len(by_kind) > 1:
        unc = by_kind["uncached"]
        report["speedup"] = {
            f"cached {k} vs uncached, decode throughput": r["decode_tokens_per_s"] / unc["decode_tokens_per_s"]
            for k, r in by_kind.items() if k != "uncached"
        } | {
            f"cached {k} vs uncached, total generation time": (unc["ttft_s_median"] + unc["decode_time_s_median"])
            / (r["ttft_s_median"] + r["decode_time_s_median"])
            for k, r in by_kind.items() if k != "uncached"
        }
    if "fast" in by_kind and "eager" in by_kind:
        report.setdefault("speedup", {})["fast vs eager (cached), decode throughput"] = (
            by_kind["fast"]["decode_tokens_per_s"] / by_kind["eager"]["decode_tokens_per_s"]
        )
    if len(runs) > 1:
        report["tokens_equal"] = all(r["token_ids"] == runs[0]["token_ids"] for r in runs)

    print(format_report(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"[bench] wrote {args.json}", file=sys.stderr)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot_latency(report, args.plot)
        print(f"[bench] wrote {args.plot}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
