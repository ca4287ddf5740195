"""Engine benchmark: N requests sharing a system prompt of S tokens, prefix caching on vs off.

Examples:
    python benchmarks/bench_engine.py --model llama-tiny                         # CPU, fixture checkpoint
    python benchmarks/bench_engine.py --model llama-3.2-1b --device cuda --dtype bfloat16 \\
        --requests 32 --system-tokens 1024 --check --out engine.json --plot engine.png

Every request is the same ``--system-tokens`` random ids followed by ``--user-tokens`` ids of its
own; each generates ``--new-tokens`` tokens (EOS ignored). The two settings run in alternating
rounds in one process; the report gives, side by side, the prefill tokens computed, the prefix hit
rate, the peak blocks used and the wall time (median of the rounds), and the plot draws them.

``--check`` adds the correctness checks of the same run, teacher-forced and tie-aware (the
tolerances of the golden files for the dtype): every request with caching on, fed the tokens it
chose with caching off, and every row of the batch, fed the tokens the request chose alone.
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

from benchmarks.bench_utils import DTYPES, environment, load_bench_model, median, pick_device
from infer_ref.cache.factory import build_cache
from infer_ref.conformance.oracles.golden import Tolerance, tolerance_for
from infer_ref.conformance.oracles.teacher_forced import compare_teacher_forced
from infer_ref.engine.engine import Engine, EngineResult
from infer_ref.sampling import SamplingParams


def make_prompts(vocab: int, requests: int, system_tokens: int, user_tokens: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    system = torch.randint(4, vocab, (system_tokens,), generator=gen).tolist()
    return [system + torch.randint(4, vocab, (user_tokens,), generator=gen).tolist() for _ in range(requests)]


def pool_blocks(prompts: list[list[int]], new_tokens: int, block_size: int) -> int:
    """Enough blocks for every request at once without sharing: both settings get the same pool."""
    return sum(-(-(len(p) + new_tokens - 1) // block_size) for p in prompts)


def run_once(model: torch.nn.Module, prompts: list[list[int]], args: argparse.Namespace, caching: bool) -> dict[str, Any]:
    engine = Engine(model, num_blocks=pool_blocks(prompts, args.new_tokens, args.block_size),
                    block_size=args.block_size, enable_prefix_caching=caching, max_batch=args.max_batch)
    engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens))
    s = engine.stats
    return {
        "wall_time_s": s.wall_time_s,
        "prefill_tokens_computed": s.prefill_tokens_computed,
        "prompt_tokens": s.prefix.prompt_tokens,
        "cached_prompt_tokens": s.prefix.cached_tokens,
        "prefix_hit_rate": s.prefix.hit_rate,
        "peak_blocks_used": s.peak_blocks_used,
        "decode_steps": s.decode_steps,
        "generated_tokens": s.generated_tokens,
        "tokens_per_s": s.tokens_per_s,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[-1])  # the counters are identical across rounds; the times are not
    times = [r["wall_time_s"] for r in runs]
    out["wall_time_s"] = median(times)
    out["wall_time_s_rounds"] = [round(t, 4) for t in times]
    out["tokens_per_s"] = out["generated_tokens"] / out["wall_time_s"]
    return out


@torch.inference_mode()
def _contiguous_logits(model: torch.nn.Module, prompt: list[int], forced: list[int], split: int | None) -> torch.Tensor:
    """Teacher-forced logits ``[len(forced), V]`` through the contiguous cache, the prompt prefilled
    whole (``split`` None) or as ``prompt[:split]`` then ``prompt[split:]`` (what a prefix hit does)."""
    device = next(model.parameters()).device
    cache = build_cache("contiguous", model.config, len(prompt) + len(forced), dtype=next(model.parameters()).dtype, device=device)  # type: ignore[arg-type]
    ids = torch.tensor([prompt], device=device)
    if split is not None:
        model(ids[:, :split], kv_cache=cache)
        ids = ids[:, split:]
    out = [model(ids, kv_cache=cache)[0, -1]]
    for token in forced[:-1]:
        out.append(model(torch.tensor([[token]], device=device), kv_cache=cache)[0, -1])
    return torch.stack(out)


def measured_spread(
    model: torch.nn.Module, prompts: list[list[int]], cold: list[EngineResult], split: int, tol: Tolerance
) -> dict[str, Any]:
    """How far *correct* paths drift apart in this dtype on this model, for the first requests: the
    prompt prefilled whole vs in two chunks at ``split`` through the contiguous cache, and the
    contiguous cache (SDPA decode) vs the engine without prefix caching (paged decode kernel) —
    two implementations with different reduction orders. The engine's checks allow twice that drift
    (and never less than the golden tolerance)."""
    reports = []
    for p, r in zip(prompts, cold, strict=False):
        forced = r.token_ids
        whole = _contiguous_logits(model, p, forced, None)
        reports.append(compare_teacher_forced(whole, forced, _contiguous_logits(model, p, forced, split), tol))
        assert r.step_logits is not None
        reports.append(compare_teacher_forced(whole, forced, r.step_logits.to(whole.device), tol))
    deficit = max(r.max_deficit for r in reports)
    dlogprob = max(r.max_abs_dlogprob for r in reports)
    return {
        "what": f"contiguous cache whole vs split at {split}, and vs the engine without caching: {len(prompts)} requests",
        "max_deficit": deficit,
        "max_abs_dlogprob": dlogprob,
        "tolerance": {"eps": max(tol.eps, 2 * deficit), "topk_atol": max(tol.topk_atol, 2 * dlogprob)},
    }


def checks(model: torch.nn.Module, prompts: list[list[int]], args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    """Teacher-forced, tie-aware: caching on vs off, and each batch row vs the request alone.

    The tolerance is the golden one for ``dtype``, widened to twice the drift measured between two
    correct paths on the same model (:func:`measured_spread`): random real-shape models in bf16 have
    logits large enough that one bf16 step of a top-k logit is worth several nats.
    """
    tol = tolerance_for(dtype)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    blocks = pool_blocks(prompts, args.new_tokens, args.block_size)

    def engine(caching: bool, max_batch: int) -> Engine:
        return Engine(model, num_blocks=blocks, block_size=args.block_size, enable_prefix_caching=caching, max_batch=max_batch)

    cold = engine(False, args.max_batch).generate(prompts, greedy, keep_logits=True)
    warm_engine = engine(True, args.max_batch)
    warm = warm_engine.generate(prompts, greedy, forced_tokens=[r.token_ids for r in cold], keep_logits=True)
    if dtype != "float64":
        split = args.block_size * (len(prompts[0]) // (2 * args.block_size)) or 1
        spread = measured_spread(model, prompts[:4], cold[:4], split, tol)
        tol = Tolerance(spread["tolerance"]["eps"], spread["tolerance"]["topk_atol"], spread["what"])
    else:
        spread = None
    alone = [engine(False, 1).generate([p], greedy, keep_logits=True)[0] for p in prompts]
    batched = engine(False, args.max_batch).generate(prompts, greedy, forced_tokens=[r.token_ids for r in alone], keep_logits=True)
    result = {
        "tolerance": {"eps": tol.eps, "topk_atol": tol.topk_atol},
        "measured_spread": spread,
        "cold_vs_warm": _pairwise(cold, warm, tol),
        "batch_vs_alone": _pairwise(alone, batched, tol),
        "warm_cached_tokens": [r.num_cached_tokens for r in warm],
        "free_running_equal_cold_warm": sum(c.token_ids == w.token_ids for c, w in zip(cold, warm, strict=True)),
    }
    if sum(result["warm_cached_tokens"]) == 0:
        result["cold_vs_warm"]["ok"] = False
        result["cold_vs_warm"]["note"] = "no prefix hit happened: the check exercised nothing"
    return result


def _pairwise(reference: list[EngineResult], other: list[EngineResult], tol: Tolerance) -> dict[str, Any]:
    reports = []
    for ref, oth in zip(reference, other, strict=True):
        assert ref.step_logits is not None and oth.step_logits is not None
        reports.append(compare_teacher_forced(ref.step_logits, ref.token_ids, oth.step_logits, tol))
    return {
        "ok": all(r.ok for r in reports),
        "max_deficit": max(r.max_deficit for r in reports),
        "max_abs_dlogprob": max(r.max_abs_dlogprob for r in reports),
        "argmax_equal_steps": sum(r.exact_steps for r in reports),
        "steps": sum(r.steps for r in reports),
        "per_request": [r.summary() for r in reports],
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off, on = report["results"]["caching_off"], report["results"]["caching_on"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    labels = ["off", "on"]
    for ax, key, title in zip(
        axes,
        ("prefill_tokens_computed", "wall_time_s", "peak_blocks_used"),
        ("prefill tokens computed", "wall time (s, median)", "peak blocks used"),
        strict=True,
    ):
        values = [off[key], on[key]]
        bars = ax.bar(labels, values, color=["#999999", "#3b7dd8"])
        ax.bar_label(bars, labels=[f"{v:.3g}" if isinstance(v, float) else str(v) for v in values])
        ax.set_title(title)
        ax.set_xlabel("prefix caching")
    cfg = report["config"]
    fig.suptitle(
        f"{report['model']['name']} on {report['environment']['device_name']} ({cfg['dtype']}): {cfg['requests']} requests, "
        f"shared system prompt {cfg['system_tokens']} + {cfg['user_tokens']} tokens, {cfg['new_tokens']} new",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", "--model-shape", dest="model", default="llama-tiny",
                    help="fixture, snapshot path, or a real-shape synthetic model (llama-3.2-1b: random weights)")
    ap.add_argument("--device", default=None, help="default: cuda when available")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds (median wall time)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--check", action="store_true", help="also run the teacher-forced correctness checks")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument("--plot", type=Path, default=None, help="write the side-by-side plot here (PNG)")
    args = ap.parse_args(argv)

    device = pick_device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, info, _ = load_bench_model(args.model, device, DTYPES[dtype_name], seed=args.seed)
    prompts = make_prompts(model.config.vocab_size, args.requests, args.system_tokens, args.user_tokens, args.seed)

    run_once(model, prompts[: min(2, len(prompts))], args, True)  # warm-up (allocator, kernels)
    rounds: dict[str, list[dict[str, Any]]] = {"caching_off": [], "caching_on": []}
    for _ in range(args.rounds):
        for caching in (False, True):
            rounds["caching_on" if caching else "caching_off"].append(run_once(model, prompts, args, caching))
    results = {name: summarise(runs) for name, runs in rounds.items()}
    off, on = results["caching_off"], results["caching_on"]
    report: dict[str, Any] = {
        "model": info,
        "environment": environment(device),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {"dtype": dtype_name},
        "results": results,
        "ratios": {
            "prefill_tokens_off_over_on": off["prefill_tokens_computed"] / max(1, on["prefill_tokens_computed"]),
            "wall_time_off_over_on": off["wall_time_s"] / on["wall_time_s"],
        },
    }
    if args.check:
        report["checks"] = checks(model, prompts, args, dtype_name)

    print(f"{info['name']} on {report['environment']['device_name']} ({dtype_name}), {args.requests} requests, "
          f"system {args.system_tokens} + user {args.user_tokens} tokens, {args.new_tokens} new, block {args.block_size}")
    print(f"{'':24}{'caching off':>14}{'caching on':>14}")
    for key in ("prefill_tokens_computed", "prefix_hit_rate", "peak_blocks_used", "decode_steps", "wall_time_s", "tokens_per_s"):
        print(f"{key:24}{off[key]:>14.4g}{on[key]:>14.4g}")
    print(f"prefill tokens off/on {report['ratios']['prefill_tokens_off_over_on']:.2f}x, "
          f"wall time off/on {report['ratios']['wall_time_off_over_on']:.2f}x")
    if args.check:
        for name in ("cold_vs_warm", "batch_vs_alone"):
            c = report["checks"][name]
            print(f"check {name}: {'ok' if c['ok'] else 'FAILED'} (max deficit {c['max_deficit']:.4g}, "
                  f"max |Δlogprob| {c['max_abs_dlogprob']:.4g}, argmax equal {c['argmax_equal_steps']}/{c['steps']})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    return 0 if not args.check or all(report["checks"][n]["ok"] for n in ("cold_vs_warm", "batch_vs_alone")) else 1


if __name__ == "__main__":
    sys.exit(main())
