"""Side-by-side decode throughput: infer_ref eager / fast against transformers, plus the bandwidth roofline.

For each model, in one process and back to back on the same weights (the transformers model
shares infer_ref's weight tensors), batch 1, greedy, EOS ignored:

- ``ir_generate``:  infer_ref ``generate(decode="eager")`` (contiguous KVCache; syncs each token)
- ``ir_loop``:      infer_ref forward loop with a KVCache, argmax on the device, no per-token sync
- ``ir_fast``:      infer_ref ``generate(decode=FastDecoder)`` (static cache, CUDA-graph step)
- ``ir_fast_compiled`` (``--compile``): the same with the step compiled by torch.compile
- ``hf_generate``:  transformers ``generate()`` with its default cache; decode time is the time of
  ``N`` new tokens minus the time of 1 (the prefill)
- ``hf_loop``:      transformers forward loop with ``DynamicCache``, argmax on the device

The four eager paths (``ir_generate``, ``hf_generate``, ``ir_loop``, ``hf_loop``) run in
``--rounds`` interleaved rounds, and "eager / hf" is the per-round ratio of transformers' time to
infer_ref's (median and range): host-bound timings drift with the host's load, a per-round ratio
does not. Decode tokens/s = decode steps / decode time (median over repeats or rounds). Effective bandwidth of the
fast path = (weight bytes per token + mean KV bytes per token) x tokens/s, where weight bytes =
every parameter once except the embedding table, which is read as one row (a tied table is read in
full once, by the LM head), and KV bytes = 2 * L * Hkv * D * itemsize * (prompt + (N+1)/2). It is
compared with a device-to-device copy (bytes read + bytes written per second).

Dry run on a CPU: ``python benchmarks/decode_compare.py --device cpu --tiny``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import (
    DTYPES,
    REAL_SHAPES,
    NullDecoder,
    build_hf,
    build_infer_ref,
    d2d_copy_bandwidth,
    environment,
    hf_config_for,
    kv_bytes_per_token,
    median,
    pick_device,
    sync,
    synthetic_state,
    weight_bytes_per_token,
)
from infer_ref.cache.contiguous import KVCache
from infer_ref.engine.fast_decode import FastDecoder
from infer_ref.engine.generate import generate
from infer_ref.engine.sampling import SamplingParams

TINY = ("tiny-llama", "tiny-qwen3", "tiny-gemma3_text")


def _timed(fn: Any, device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return median(times)


@torch.inference_mode()
def ir_loop(model: Any, prompt: torch.Tensor, steps: int, device: torch.device) -> float:
    """Seconds for ``steps`` decode forwards after the prefill (not timed)."""
    cache = KVCache.from_model_config(
        model.config, prompt.shape[1] + steps + 1, dtype=next(model.parameters()).dtype, device=device
    )
    tok = model(prompt, kv_cache=cache)[:, -1].argmax(-1, keepdim=True)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = model(tok, kv_cache=cache)[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def hf_loop(hf: Any, prompt: torch.Tensor, steps: int, device: torch.device) -> float:
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    out = hf(input_ids=prompt, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = hf(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def hf_generate(hf: Any, prompt: torch.Tensor, new_tokens: int) -> Any:
    return hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, pad_token_id=0, eos_token_id=None,
    )


def interleaved_eager_rounds(
    model: Any, hf: Any, prompt: torch.Tensor, prompt_list: list[int], params: SamplingParams,
    device: torch.device, args: argparse.Namespace,
) -> dict[str, Any]:
    """infer_ref's and transformers' eager paths, alternated round by round on the same weights.

    A host-bound eager decode moves with the host's load (up to 2x between runs on a shared
    machine), so each round times all four paths back to back and the infer_ref/transformers
    ratios are taken per round: drift hits both sides of a ratio alike. Decode seconds per path.
    """
    steps = params.max_new_tokens - 1
    rounds: list[dict[str, float]] = []
    for r in range(args.warmup + args.rounds):
        t = {
            "ir_generate": generate(model, NullDecoder(), prompt_list, params, device=device).timing.decode_time_s,
            "hf_generate": max(_timed(lambda: hf_generate(hf, prompt, params.max_new_tokens), device, 0, 1)
                               - _timed(lambda: hf_generate(hf, prompt, 1), device, 0, 1), 1e-9),
            "ir_loop": ir_loop(model, prompt, steps, device),
            "hf_loop": hf_loop(hf, prompt, steps, device),
        }
        if r >= args.warmup:
            rounds.append(t)
    ratios = {
        "generate": [x["hf_generate"] / x["ir_generate"] for x in rounds],
        "loop": [x["hf_loop"] / x["ir_loop"] for x in rounds],
    }
    return {
        "rounds": rounds,
        "median_s": {k: median([x[k] for x in rounds]) for k in rounds[0]},
        "speedup_over_hf": {k: {"median": median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()},
    }


def measure_model(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    hf_config = hf_config_for(name)
    assert hf_config is not None
    t_build = time.perf_counter()
    model = build_infer_ref(hf_config, synthetic_state(hf_config, device, dtype, seed=args.seed), device)
    model.config = dataclasses.replace(model.config, eos_token_ids=())
    hf = None if args.fast_only else build_hf(hf_config, model, device, dtype)
    sync(device)
    print(f"[compare] {name}: weights ready in {time.perf_counter() - t_build:.1f}s", file=sys.stderr, flush=True)
    config = model.config
    gen = torch.Generator().manual_seed(args.seed)
    prompt_list = torch.randint(4, config.vocab_size, (args.prompt_len,), generator=gen).tolist()
    prompt = torch.tensor([prompt_list], device=device)
    n, steps = args.new_tokens, args.new_tokens - 1
    params = SamplingParams(temperature=0.0, max_new_tokens=n)
    row: dict[str, Any] = {"model": name, "parameters": sum(p.numel() for p in model.parameters())}
    tps: dict[str, float] = {}

    def record(key: str, seconds: float) -> None:
        tps[key] = steps / seconds
        print(f"[compare] {name}: {key:18s} {tps[key]:8.1f} tok/s", file=sys.stderr, flush=True)

    def ir_gen(mode: Any) -> float:
        runs = [generate(model, NullDecoder(), prompt_list, params, device=device, decode=mode)
                for _ in range(args.warmup + args.repeats)]
        return median([r.timing.decode_time_s for r in runs[args.warmup:]])

    if hf is not None:
        row["interleaved"] = interleaved_eager_rounds(model, hf, prompt, prompt_list, params, device, args)
        for key, seconds in row["interleaved"]["median_s"].items():
            record(key, seconds)
    fast = FastDecoder(model, args.prompt_len + n, device=device)
    record("ir_fast", ir_gen(fast))
    fast_tokens = generate(model, NullDecoder(), prompt_list, params, device=device, decode=fast).token_ids
    eager_tokens = generate(model, NullDecoder(), prompt_list, params, device=device).token_ids
    del fast
    if args.fast_only:
        hf = None
    if args.compile:
        try:
            t0 = time.perf_counter()
            compiled = FastDecoder(model, args.prompt_len + n, device=device, compile=True)
            row["compile_s"] = time.perf_counter() - t0
            record("ir_fast_compiled", ir_gen(compiled))
            del compiled
        except Exception as exc:  # keep the row: report why the compiled step is missing
            row["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"[compare] {name}: compile failed: {row['compile_error']}", file=sys.stderr)

    wbytes = weight_bytes_per_token(model)
    itemsize = next(model.parameters()).element_size()
    kv_mean = kv_bytes_per_token(config, args.prompt_len + (n + 1) / 2, itemsize)
    best_fast = max(tps.get("ir_fast", 0.0), tps.get("ir_fast_compiled", 0.0))
    row.update(
        tokens_per_s=tps,
        weight_bytes_per_token=wbytes,
        kv_bytes_per_token_mean=kv_mean,
        fast_bandwidth_GBps=(wbytes + kv_mean) * tps["ir_fast"] / 1e9,
        best_fast_bandwidth_GBps=(wbytes + kv_mean) * best_fast / 1e9,
        fast_equals_eager_tokens_prefix=_common_prefix(fast_tokens, eager_tokens),
        new_tokens=n,
    )
    return row


def _speedup(row: dict[str, Any], kind: str) -> str:
    """``1.52x (1.40-1.61)``: median and range over the interleaved rounds of hf time / infer_ref time."""
    s = row.get("interleaved", {}).get("speedup_over_hf", {}).get(kind)
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})" if s else "-"


def _common_prefix(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def markdown(result: dict[str, Any]) -> str:
    env, d2d = result["environment"], result["d2d"]
    bw = d2d["best_GBps"]
    cols = ["ir_generate", "ir_loop", "ir_fast", "ir_fast_compiled", "hf_generate", "hf_loop"]
    present = [c for c in cols if any(c in r["tokens_per_s"] for r in result["rows"])]
    lines = [
        f"Decode throughput, batch 1, greedy, {result['dtype']}, prompt {result['prompt_len']}, "
        f"{result['new_tokens']} new tokens; {env['device_name']}, torch {env['torch']}, transformers {env['transformers']}.",
        f"Device-to-device copy: {bw:.0f} GB/s (best of {d2d['iters']}, read + write counted).",
        "",
        "| model | " + " | ".join(f"{c} tok/s" for c in present)
        + " | weight MB/token | fast GB/s | fast % of copy BW | best fast % | eager / hf generate() | eager / hf loop | fast = eager tokens |",
        "|---" * (len(present) + 8) + "|",
    ]
    for r in result["rows"]:
        t = r["tokens_per_s"]
        vals = [f"{t[c]:.1f}" if c in t else "-" for c in present]
        lines.append(
            f"| {r['model']} | " + " | ".join(vals)
            + f" | {r['weight_bytes_per_token'] / 1e6:.0f} | {r['fast_bandwidth_GBps']:.0f}"
            + f" | {100 * r['fast_bandwidth_GBps'] / bw:.1f}% | {100 * r['best_fast_bandwidth_GBps'] / bw:.1f}%"
            + "".join(f" | {_speedup(r, kind)}" for kind in ("generate", "loop"))
            + f" | {r['fast_equals_eager_tokens_prefix']}/{r['new_tokens']} |"
        )
    lines += ["", "Bandwidth = (weight bytes per token + KV bytes at the mean context) x tokens/s; "
              "weight bytes count every parameter once, the embedding table as one row unless tied "
              "(then once, as the LM head)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help=f"default: {' '.join(REAL_SHAPES)} (--tiny: tiny-*)")
    ap.add_argument("--tiny", action="store_true", help="tiny synthetic models (dry run)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the eager infer_ref/transformers paths")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd fast step")
    ap.add_argument("--fast-only", action="store_true", help="time only the fast path(s): no eager, no transformers")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    models = args.models or (list(TINY) if args.tiny else list(REAL_SHAPES))

    d2d = d2d_copy_bandwidth(device, mib=1024 if device.type == "cuda" else 64)
    d2d["iters"] = 20
    print(f"[compare] d2d copy: {d2d['best_GBps']:.0f} GB/s", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."), "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "warmup": args.warmup, "repeats": args.repeats, "environment": environment(device), "d2d": d2d, "rows": [],
    }
    for name in models:
        try:
            result["rows"].append(measure_model(name, args, device, dtype))
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:
            result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"[compare] {name} FAILED: {exc}", file=sys.stderr, flush=True)
        if args.json:  # write after every row: a later failure keeps the earlier rows
            args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result) if result["rows"] else "no rows"
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return result


if __name__ == "__main__":
    main()
