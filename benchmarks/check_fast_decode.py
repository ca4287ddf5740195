"""Fast decode path against the eager path on a device, teacher-forced like the golden files.

For each model: greedy-generate N tokens with the eager path, then feed the eager sequence step
by step through both the eager cached forward and the fast decoder (captured step on CUDA) and
compare, at every step, the log-probabilities: the eager token must be within ``eps`` of the fast
path's best log-probability, and the top-k log-probabilities must be close. The free-running
exact-match length (fast tokens vs eager tokens) is reported beside it: in bf16 the two paths
reduce in different orders, so long free-running runs of random-weight models may part.
Tiny models in float32 must give exactly the same tokens.

GPU: ``python benchmarks/check_fast_decode.py --json out.json``; dry run: ``--device cpu --tiny``.
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
    REAL_SHAPES,
    NullDecoder,
    environment,
    load_bench_model,
    pick_device,
)
from infer_ref.cache.contiguous import KVCache
from infer_ref.engine import FastDecoder
from infer_ref.engine.generate import generate
from infer_ref.sampling import SamplingParams

TINY = ("tiny-llama", "tiny-qwen3", "tiny-gemma3_text")


@torch.inference_mode()
def check(
    name: str, device: torch.device, dtype: torch.dtype, prompt_len: int, new: int, eps: float, top_k: int,
    compile: bool = False,
) -> dict[str, Any]:
    if compile:
        torch._dynamo.reset()  # a fresh compile per model, not recompilations of one cached frame
    model, info, _ = load_bench_model(name, device, dtype, seed=1)
    config = model.config
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, config.vocab_size, (prompt_len,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_new_tokens=new)
    eager = generate(model, NullDecoder(), prompt, params, device=device).token_ids
    decoder = FastDecoder(model, prompt_len + new, device=device, compile=compile)
    fast = generate(model, NullDecoder(), prompt, params, device=device, decode=decoder).token_ids
    free_running = next((i for i, (a, b) in enumerate(zip(eager, fast, strict=True)) if a != b), new)

    # Teacher-forced: both paths read the eager sequence.
    seq = torch.tensor([prompt + eager], device=device)
    cache = KVCache.from_model_config(config, seq.shape[1], dtype=dtype, device=device)
    decoder.reset()
    e_logits = model(seq[:, :prompt_len], kv_cache=cache)[0, -1]
    f_logits = decoder.prefill(seq[:, :prompt_len])[0, -1]
    worst_gap, worst_topk, failures = 0.0, 0.0, []
    for step in range(new):
        e_lp, f_lp = e_logits.float().log_softmax(-1), f_logits.float().log_softmax(-1)
        token = eager[step]
        gap = float(f_lp.max() - f_lp[token])
        top = e_lp.topk(top_k).indices
        topk_diff = float((e_lp[top] - f_lp[top]).abs().max())
        worst_gap, worst_topk = max(worst_gap, gap), max(worst_topk, topk_diff)
        if gap > eps:
            failures.append({"step": step, "token": token, "gap": gap})
        if step + 1 == new:
            break
        nxt = seq[:, prompt_len + step : prompt_len + step + 1]
        e_logits = model(nxt, kv_cache=cache)[0, -1]
        decoder.set_input(nxt[0])
        f_logits = decoder.step()[0, -1]
    return {
        "model": name,
        "source": info["source"],
        "dtype": str(dtype).removeprefix("torch."),
        "captured": decoder.use_cuda_graph,
        "compiled": decoder.compiled,
        "prompt_len": prompt_len,
        "new_tokens": new,
        "free_running_exact_match": free_running,
        "tokens_equal": eager == fast,
        "teacher_forced_max_gap_to_best_logprob": worst_gap,
        "teacher_forced_max_topk_logprob_diff": worst_topk,
        "eps": eps,
        "failures": failures[:10],
        "passed": not failures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--tiny", action="store_true", help="only the tiny models (dry run on a CPU)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--eps", type=float, default=0.1, help="bf16 teacher-forced tolerance (log-prob)")
    ap.add_argument("--compile", action="store_true", help="check the torch.compile'd step (CUDA) instead")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    # Exact check: tiny models in float32 (clear margins, same tokens required), across sliding windows.
    plan = [(n, torch.float32, 1e-4) for n in TINY]
    if not args.tiny:
        plan += [(n, DTYPES["bfloat16"], args.eps) for n in REAL_SHAPES]
    results: list[dict[str, Any]] = []
    for name, dtype, eps in plan:
        try:
            r = check(name, device, dtype, args.prompt_len, args.new_tokens, eps, top_k=5, compile=args.compile)
            if dtype == torch.float32:
                r["passed"] = r["passed"] and r["tokens_equal"]
        except Exception as exc:
            r = {"model": name, "dtype": str(dtype).removeprefix("torch."), "passed": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}
        results.append(r)
        print(
            f"[fast-check{' compiled' if args.compile else ''}] {name:18s} {r.get('dtype', '')}: {'PASS' if r['passed'] else 'FAIL'} "
            f"free-running match {r.get('free_running_exact_match', '-')}/{args.new_tokens}, "
            f"max gap {r.get('teacher_forced_max_gap_to_best_logprob', float('nan')):.3g}, "
            f"max top-5 diff {r.get('teacher_forced_max_topk_logprob_diff', float('nan')):.3g}"
            + (f" ERROR {r['error']}" if "error" in r else ""),
            flush=True,
        )
        torch.cuda.empty_cache() if device.type == "cuda" else None
    report = {"environment": environment(device), "results": results, "passed": all(r["passed"] for r in results)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"[fast-check] overall: {'PASS' if report['passed'] else 'FAIL'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
