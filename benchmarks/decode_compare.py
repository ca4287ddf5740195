"""Side-by-side decode throughput and accuracy: infer_ref eager / fast against transformers, and a context sweep.

For each model, in one process and back to back on the same weights (the transformers model
shares infer_ref's weight tensors), batch 1, greedy, EOS ignored, at the first context
(``--contexts``, default ``--prompt-len``):

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
does not. Decode tokens/s = decode steps / decode time (median over repeats or rounds).

Bandwidth. Effective bandwidth = (weight bytes per token + mean KV bytes per token) x tokens/s,
where weight bytes = every parameter once except the embedding table, which is read as one row (a
tied table is read in full once, by the LM head), and KV bytes = ``2 * Hkv * D * itemsize`` per
key a layer attends, a step at position ``p`` attending ``p + 1`` keys (a sliding layer at most its
window), averaged over the decode steps. It is compared with a device-to-device copy (bytes read +
bytes written per second).

Accuracy. Every timed path (``ir_loop``, ``ir_fast``, ``ir_fast_compiled``, ``hf_loop``) is run
again, teacher-forced, in a pass separate from the timed one: all are fed the same tokens, the
prompt plus the continuation a float32 reference picks greedily. The reference's tokens rather
than the eager path's, because then no path is scored on tokens it chose itself and "the
reference's token" at a step is the token fed next. The reference is the same weights upcast to
float32 (one copy per model, freed before anything is timed), run with a float32 contiguous
KVCache: cached float32 logits differ from a full recompute by reduction order only (~1e-6, far
below bf16's ~1e-2), and a recompute would cost a full prefill per token at 16k tokens. At each
decode step (the N-1 steps after the prefill, the steps tokens/s times) the path's next-token
log-probs are compared with the reference's: mean KL(reference || path) over the steps, and max
|Δlogprob| of the reference's token at each step (``benchmarks/accuracy.py``). A path "counts"
when both are <= the transformers bf16 loop's x ``--accuracy-margin`` (default 1.25): two bf16
paths that compute the same thing in different reduction orders are equally precise but not
equal, so each lands a different amount of rounding noise away from the reference, and a margin
keeps an equally precise path from failing on that noise, while a path that loses precision
(a lower-precision accumulation, a dropped term) moves well past it.

Context sweep (``--contexts 128 1024 4096 16384``, ``--caches static paged``): per model and cache
type, the fast step (compiled with ``--compile``, else the CUDA-graph step) at a prompt of each
length, ``--new-tokens`` decoded (default 64 with a sweep): tok/s, GB/s, % of copy bandwidth, the
agreement above, and the transformers loop's agreement at contexts <= ``--hf-accuracy-up-to``
(default 4096: a 16k-token transformers run is the slow part and only sets the bar). The eager
and transformers throughput rounds run at the first context only. One decoder per (model, cache
type), sized for the largest context plus the new tokens, serves every context (reset between):
one compile per model and cache type instead of one per context. A static cache then holds
``S_max`` slots at every context. Attention over it with a mask would read all ``S_max`` slots, so
a short context would pay the longest context's attention; on CUDA the one-token step attends
through the length-aware decode kernel, which reads only the ``pos + 1`` live positions, so the
slot count does not enter the timings (on a CPU, where the step is the masked one, it does: the
dry run's tokens/s are not a measurement). The prompts are prefixes of one seeded draw. ``--budget-s`` skips (and lists as skipped) any unit of work (a
reference, a decoder's compile, a point) whose estimate, from the units measured so far, would
end past the budget (``benchmarks/budget.py``).

Dry run on a CPU: ``python benchmarks/decode_compare.py --device cpu --tiny`` and
``--device cpu --tiny --contexts 32 64 --caches static paged``.
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
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import (
    DTYPES,
    REAL_SHAPES,
    NullDecoder,
    build_hf,
    build_infer_ref,
    calibrate_logit_scale,
    d2d_copy_bandwidth,
    environment,
    hf_config_for,
    kv_bytes_attended,
    median,
    pick_device,
    sync,
    synthetic_state,
    weight_bytes_per_token,
)
from benchmarks.budget import Budget, DurationEstimates, Units
from benchmarks.context_sweep import (
    CACHES,
    add_vs_static,
    build_fast_decoder,
    fmt_num,
    fmt_yes_no,
    judge,
    measure_point,
    plot_sweep,
    step_kind,
    sweep_markdown,
)
from benchmarks.teacher_forced import (
    EagerPath,
    Reference,
    TransformersPath,
    float32_copy,
    float32_reference,
    path_agreement,
)
from infer_ref.cache.contiguous import KVCache
from infer_ref.config import ModelConfig
from infer_ref.engine.generate import generate
from infer_ref.sampling import SamplingParams

TINY = ("tiny-llama", "tiny-qwen3", "tiny-gemma3_text")
# Paths whose teacher-forced agreement is reported beside their tokens/s.
ACCURACY_PATHS = ("ir_loop", "ir_fast", "ir_fast_compiled", "hf_loop")
# Budget estimate of a compile + capture before any was measured (H100: 50-95 s per model).
COMPILE_ESTIMATE_S = 120.0


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
        # The argmax is in range by construction: no per-step id check (its host sync would stall
        # the loop; transformers' loop has none either).
        tok = model(tok, kv_cache=cache, check_ids=False)[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def hf_loop(hf: Any, prompt: torch.Tensor, steps: int, device: torch.device) -> float:
    from transformers import DynamicCache

    from infer_ref.conformance.oracles.transformers_cache import cache_keyword

    keyword = cache_keyword(hf)  # read once, outside the timed loop
    out = hf(input_ids=prompt, use_cache=True, **{keyword: DynamicCache(config=hf.config)})
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = hf(input_ids=tok, use_cache=True, **{keyword: out[keyword]})
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


def float32_references(
    model: nn.Module, prompts: dict[int, torch.Tensor], new_tokens: int, units: Units
) -> dict[int, Reference]:
    """The float32 reference at every context, from one float32 copy of the weights (freed on return)."""
    references: dict[int, Reference] = {}
    model32 = units.run("float32 copy of the weights", "float32_copy", lambda: float32_copy(model))
    if model32 is None:
        return references
    for context, prompt in prompts.items():
        ref = units.run(f"float32 reference at context {context}", f"reference:{units.model}",
                        lambda p=prompt: float32_reference(model32, p, new_tokens), context)  # type: ignore[misc]
        if ref is not None:
            references[context] = ref
    model32 = None  # the one float32 copy goes before anything is timed
    _free_memory(next(model.parameters()).device)
    return references


def transformers_accuracy(
    hf: nn.Module | None, references: dict[int, Reference], args: argparse.Namespace, units: Units
) -> dict[int, dict[str, Any]]:
    """transformers' loop, teacher-forced, at the first context and every context <= ``--hf-accuracy-up-to``."""
    out: dict[int, dict[str, Any]] = {}
    for context, reference in references.items():
        if hf is None or not (context == args.contexts[0] or context <= args.hf_accuracy_up_to):
            continue
        agreement = units.run(f"transformers accuracy at context {context}", f"hf_accuracy:{units.model}",
                              lambda r=reference: path_agreement(TransformersPath(hf), r).as_dict(),  # type: ignore[misc]
                              context)
        if agreement is not None:
            out[context] = agreement
    return out


def sweep_cache(
    model: nn.Module, cache: str, compile: bool, prompts: dict[int, list[int]], references: dict[int, Reference],
    hf_accuracy: dict[int, dict[str, Any]], args: argparse.Namespace, units: Units, point_args: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every context's point for one cache type, from one decoder sized for the largest context (+ new tokens)."""
    max_seq_len = max(args.contexts) + args.new_tokens
    decoder = units.run(f"{cache} decoder{' (compile)' if compile else ''}", "compile" if compile else "capture",
                        lambda: build_fast_decoder(model, max_seq_len, cache, block_size=args.block_size,
                                                   device=point_args["device"], compile=compile))
    if decoder is None:
        return [{"cache": cache, "context": c, "skipped": f"decoder: {units.last_reason}"} for c in prompts]
    points = []
    # Compiled and graph-only points are separate kinds: a graph-only step is several times slower,
    # and a compiled point's estimate scaled from it would skip points that fit (the budget).
    step = step_kind(decoder)
    for context, prompt in prompts.items():
        point = units.run(f"{cache} {step} point at context {context}", f"point:{units.model}:{cache}:{step}",
                          lambda p=prompt, c=context: measure_point(  # type: ignore[misc]
                              model, decoder, cache, p, references.get(c), **point_args), context)
        if point is None:
            points.append({"cache": cache, "context": context, "step": step_kind(decoder),
                           "skipped": units.last_reason})
            continue
        point["hf_accuracy"] = hf_accuracy.get(context)
        point["counts"] = judge(point["accuracy"], point["hf_accuracy"], args.accuracy_margin)
        print(f"[compare] {units.model}: {cache:6s} {point['step']:10s} context {context:6d} "
              f"{point['tokens_per_s']:8.1f} tok/s {point['pct_copy_bw']:5.1f}% of copy BW, "
              f"KL {(point['accuracy'] or {}).get('mean_kl', float('nan')):.3g}", file=sys.stderr, flush=True)
        points.append(point)
    decoder = None  # its cache and graph pool go before the next decoder is built
    _free_memory(point_args["device"])
    return points


def measure_model(
    name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, copy_GBps: float,
    budget: Budget, estimates: DurationEstimates,
) -> dict[str, Any]:
    hf_config = hf_config_for(name)
    assert hf_config is not None
    t_build = time.perf_counter()
    model = build_infer_ref(hf_config, synthetic_state(hf_config, device, dtype, seed=args.seed), device)
    config: ModelConfig = dataclasses.replace(model.config, eos_token_ids=())  # type: ignore[type-var,assignment]
    model.config = config  # type: ignore[assignment]
    if args.logit_entropy > 0:  # before transformers shares the tensors: both models get the same scale
        probe = torch.randint(4, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(args.seed + 1))
        calibrate_logit_scale(model, args.logit_entropy, probe.to(device))
    hf = None if args.fast_only else build_hf(hf_config, model, device, dtype)
    sync(device)
    print(f"[compare] {name}: weights ready in {time.perf_counter() - t_build:.1f}s", file=sys.stderr, flush=True)
    units = Units(name, budget, estimates)
    contexts, n = args.contexts, args.new_tokens
    first, s_max = contexts[0], max(contexts) + n
    gen = torch.Generator().manual_seed(args.seed)
    longest = torch.randint(4, config.vocab_size, (max(contexts),), generator=gen).tolist()
    prompts = {c: longest[:c] for c in contexts}  # every context's prompt is a prefix of the longest
    wbytes = weight_bytes_per_token(model)
    row: dict[str, Any] = {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
                           "max_seq_len": s_max, "weight_bytes_per_token": wbytes, "new_tokens": n}

    references = float32_references(model, {c: torch.tensor([p], device=device) for c, p in prompts.items()}, n, units)
    tps: dict[str, float] = {}
    if hf is not None:
        rounds = units.run("eager/transformers rounds", "rounds", lambda: interleaved_eager_rounds(
            model, hf, torch.tensor([prompts[first]], device=device), prompts[first],
            SamplingParams(temperature=0.0, max_new_tokens=n), device, args))
        if rounds is not None:
            row["interleaved"] = rounds
            tps.update({key: (n - 1) / seconds for key, seconds in rounds["median_s"].items()})
    hf_accuracy = transformers_accuracy(hf, references, args, units)
    accuracy: dict[str, dict[str, Any]] = {}
    if first in hf_accuracy:
        accuracy["hf_loop"] = hf_accuracy[first]
    if first in references:
        eager = units.run("eager accuracy", "eager_accuracy",
                          lambda: path_agreement(EagerPath(model, first + n), references[first]).as_dict())
        if eager is not None:
            accuracy["ir_loop"] = eager

    point_args = {"new_tokens": n, "device": device, "warmup": args.warmup, "repeats": args.repeats,
                  "weight_bytes": wbytes, "copy_GBps": copy_GBps}
    sweep: list[dict[str, Any]] = []
    graph_point = None
    if args.compile or "static" not in args.caches:
        # The graph-only static step at the first context (the sweep's static points are not graph-only).
        graph_point = sweep_cache(model, "static", False, {first: prompts[first]}, references, hf_accuracy, args,
                                  units, point_args)[0]
    for cache in args.caches:
        sweep += sweep_cache(model, cache, args.compile, prompts, references, hf_accuracy, args, units, point_args)
    add_vs_static(sweep)
    static_first = next((p for p in sweep if p["cache"] == "static" and p["context"] == first), None)
    for key, point in (("ir_fast", graph_point or static_first),
                       ("ir_fast_compiled", static_first if args.compile else None)):
        if point is not None and "tokens_per_s" in point:
            tps[key] = point["tokens_per_s"]
            if point["accuracy"] is not None:
                accuracy[key] = point["accuracy"]
    for key, value in tps.items():
        print(f"[compare] {name}: {key:18s} {value:8.1f} tok/s", file=sys.stderr, flush=True)
    kv_mean = kv_bytes_attended(config, first, n - 1, next(model.parameters()).element_size())
    best_fast = max(tps.get("ir_fast", 0.0), tps.get("ir_fast_compiled", 0.0))
    row.update(
        paths=path_reports(tps, accuracy, args.accuracy_margin),
        sweep=sweep,
        tokens_per_s=tps,
        kv_bytes_per_token_mean=kv_mean,
        fast_bandwidth_GBps=(wbytes + kv_mean) * tps["ir_fast"] / 1e9 if "ir_fast" in tps else None,
        best_fast_bandwidth_GBps=(wbytes + kv_mean) * best_fast / 1e9 if best_fast else None,
        errors=units.errors,
        durations_s=units.durations,
    )
    return row


def path_reports(
    tps: dict[str, float], accuracy: dict[str, dict[str, Any]], margin: float
) -> dict[str, dict[str, Any]]:
    """Per timed path: tok/s, mean KL, max |Δlogprob| and whether it counts (against ``hf_loop``)."""
    return {
        key: {"tokens_per_s": tps.get(key), **(accuracy.get(key) or {}),
              "counts": judge(accuracy.get(key), accuracy.get("hf_loop"), margin)}
        for key in ACCURACY_PATHS if key in tps or key in accuracy
    }


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _speedup(row: dict[str, Any], kind: str) -> str:
    """``1.52x (1.40-1.61)``: median and range over the interleaved rounds of hf time / infer_ref time."""
    s = row.get("interleaved", {}).get("speedup_over_hf", {}).get(kind)
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})" if s else "-"


def markdown(result: dict[str, Any]) -> str:
    env, d2d = result["environment"], result["d2d"]
    bw = d2d["best_GBps"]
    cols = ["ir_generate", "ir_loop", "ir_fast", "ir_fast_compiled", "hf_generate", "hf_loop"]
    present = [c for c in cols if any(c in r["tokens_per_s"] for r in result["rows"])]
    first = result["contexts"][0]
    lines = [
        f"Decode throughput, batch 1, greedy, {result['dtype']}, prompt {first}, "
        f"{result['new_tokens']} new tokens; {env['device_name']}, torch {env['torch']}, transformers {env['transformers']}.",
        f"Device-to-device copy: {bw:.0f} GB/s (best of {d2d['iters']}, read + write counted).",
        *([f"The fast decoders hold {max(result['contexts']) + result['new_tokens']} positions (rounded up to "
           "the slot alignment), the sweep's longest context; on CUDA the step reads only the live ones."]
          if len(result["contexts"]) > 1 else []),
        "",
        "| model | " + " | ".join(f"{c} tok/s" for c in present)
        + " | weight MB/token | fast GB/s | fast % of copy BW | best fast % | eager / hf generate() | eager / hf loop |",
        "|---" * (len(present) + 7) + "|",
    ]
    for r in result["rows"]:
        t = r["tokens_per_s"]
        vals = [f"{t[c]:.1f}" if c in t else "-" for c in present]
        fast, best = r["fast_bandwidth_GBps"], r["best_fast_bandwidth_GBps"]
        lines.append(
            f"| {r['model']} | " + " | ".join(vals)
            + f" | {r['weight_bytes_per_token'] / 1e6:.0f} | {fmt_num(fast, '.0f')}"
            + f" | {fmt_num(fast and 100 * fast / bw, '.1f')}% | {fmt_num(best and 100 * best / bw, '.1f')}%"
            + "".join(f" | {_speedup(r, kind)}" for kind in ("generate", "loop")) + " |"
        )
    lines += ["", "Bandwidth = (weight bytes per token + KV bytes attended, mean over the decode steps) x tokens/s; "
              "weight bytes count every parameter once, the embedding table as one row unless tied "
              "(then once, as the LM head).", ""]
    lines += [f"Teacher-forced agreement with the float32 reference at context {first} "
              f"({result['new_tokens'] - 1} decode steps; a path counts when mean KL and max |Δlogprob| are each "
              f"<= the transformers loop's (same dtype) x {result['accuracy_margin']}):", "",
              "| model | path | tok/s | mean KL(ref ‖ path) | max abs Δlogprob of the reference token | counts |",
              "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        for key, p in r.get("paths", {}).items():
            lines.append(f"| {r['model']} | {key} | {fmt_num(p.get('tokens_per_s'), '.1f')} | {fmt_num(p.get('mean_kl'), '.3g')} "
                         f"| {fmt_num(p.get('max_abs_dlogprob'), '.3g')} | "
                         + ("baseline" if key == "hf_loop" else fmt_yes_no(p.get("counts"))) + " |")
    if any(len(r.get("sweep", [])) for r in result["rows"]):
        lines += ["", f"Context sweep (fast step, decoder of {result['rows'][0]['max_seq_len']} positions reused "
                  "for every context):", "", sweep_markdown(result["rows"], result["accuracy_margin"])]
    if result.get("skipped"):
        lines += ["", f"Skipped to stay within --budget-s {result['budget_s']}: "
                  + "; ".join(s["what"] for s in result["skipped"])]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help=f"default: {' '.join(REAL_SHAPES)} (--tiny: tiny-*)")
    ap.add_argument("--tiny", action="store_true", help="tiny synthetic models (dry run)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    ap.add_argument("--prompt-len", type=int, default=128, help="the prompt without --contexts")
    ap.add_argument("--contexts", type=int, nargs="+", default=None,
                    help="prompt lengths of the sweep, e.g. 128 1024 4096 16384 (the first one gets the full table)")
    ap.add_argument("--caches", nargs="+", choices=CACHES, default=["static"], help="fast-step cache types to sweep")
    ap.add_argument("--block-size", type=int, default=16, help="paged cache block size")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128, or 64 with --contexts")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the eager infer_ref/transformers paths")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--logit-entropy", type=float, default=2.0,
        help="scale the final norm so the synthetic model's next-token distributions have this mean entropy "
        "in nats (0: leave them; raw, every softmax is one-hot and the accuracy columns cannot tell paths apart)",
    )
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd fast step (the sweep's step)")
    ap.add_argument("--fast-only", action="store_true", help="time only the fast path(s): no eager, no transformers")
    ap.add_argument("--accuracy-margin", type=float, default=1.25,
                    help="a path counts if its mean KL and max |Δlogprob| are <= transformers' x this")
    ap.add_argument("--hf-accuracy-up-to", type=int, default=4096,
                    help="run the transformers accuracy loop at contexts up to this (always at the first context)")
    ap.add_argument("--budget-s", type=float, default=None, help="skip (and report) work that would end past this")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--plot", type=Path, help="PNG of tok/s and %% of copy bandwidth against context")
    args = ap.parse_args(argv)
    args.contexts = args.contexts or [args.prompt_len]
    args.new_tokens = args.new_tokens or (64 if len(args.contexts) > 1 else 128)
    if min(args.contexts) < 1 or args.new_tokens < 2:
        ap.error(f"contexts must be >= 1 and --new-tokens >= 2, got {args.contexts} and {args.new_tokens}")
    if not args.accuracy_margin >= 1.0:
        ap.error(f"--accuracy-margin must be >= 1, got {args.accuracy_margin}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    estimates = DurationEstimates({"compile": COMPILE_ESTIMATE_S})
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    models = args.models or (list(TINY) if args.tiny else list(REAL_SHAPES))

    d2d = d2d_copy_bandwidth(device, mib=1024 if device.type == "cuda" else 64)
    d2d["iters"] = 20
    print(f"[compare] d2d copy: {d2d['best_GBps']:.0f} GB/s", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."), "contexts": args.contexts, "prompt_len": args.contexts[0],
        "new_tokens": args.new_tokens, "caches": args.caches, "compile": args.compile,
        "accuracy_margin": args.accuracy_margin, "hf_accuracy_up_to": args.hf_accuracy_up_to,
        "reference": "float32 copy of the weights, contiguous KVCache, greedy; rows are the decode steps",
        "float32_matmul_precision": torch.get_float32_matmul_precision(), "budget_s": args.budget_s,
        "warmup": args.warmup, "repeats": args.repeats, "environment": environment(device), "d2d": d2d, "rows": [],
    }
    for name in models:
        try:
            result["rows"].append(measure_model(name, args, device, dtype, d2d["best_GBps"], budget, estimates))
        except Exception as exc:
            result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"[compare] {name} FAILED: {exc}", file=sys.stderr, flush=True)
        _free_memory(device)
        result["skipped"], result["elapsed_s"] = budget.skipped, budget.elapsed()
        if args.json:  # write after every row: a later failure keeps the earlier rows
            args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result) if result["rows"] else "no rows"
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.plot and result["rows"]:
        plot_sweep(result["rows"], args.plot)
    return result


if __name__ == "__main__":
    main()
