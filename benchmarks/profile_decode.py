"""Where one decode step's time goes: kernels per step, GPU busy time, host time, top kernels.

For one model, after a prompt of ``--prompt-len`` tokens, profiles ``--steps`` decode steps of:

- ``eager``:    the eager forward with a contiguous :class:`KVCache` (host-bound on a GPU)
- ``static``:   the static-shape step of :class:`FastDecoder`, not captured (same kernels as ``graph``)
- ``graph``:    that step replayed from its CUDA graph (wall time only: replays hide their kernels)
- ``compiled``: the torch.compile'd step, profiled uncaptured, then timed as captured (``--compile``)
- ``hf``:       the transformers forward with ``DynamicCache`` (``--hf``)

Per mode it reports the wall time per step, the kernels launched per step, the summed kernel
time per step (the GPU-busy floor of a captured step) and the kernels that take the most time.
The gap between wall time and kernel time is launch overhead (eager) or inter-kernel gaps (graph).

``python benchmarks/profile_decode.py --model llama-3.2-1b --compile default tuned --hf --json out.json``
Dry run on a CPU (no kernels are recorded there): ``--device cpu --model tiny-llama``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import DTYPES, build_hf, environment, load_bench_model, pick_device, sync
from infer_ref.cache.contiguous import KVCache
from infer_ref.engine import FastDecoder
from infer_ref.engine.capture import COMPILE_OPTIONS
from infer_ref.fast.switch import decode_kernels

# Inductor options per --compile variant ("tuned" is what FastDecoder(compile=True) uses).
COMPILE_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "tuned": COMPILE_OPTIONS,
    "autotune": {**COMPILE_OPTIONS, "max_autotune": True},  # Triton GEMM templates against cuBLAS
}


def kernel_profile(step: Callable[[], Any], steps: int, device: torch.device, top_n: int = 10) -> dict[str, Any]:
    """Kernels per step, summed kernel microseconds per step, and the ``top_n`` costliest kernels."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    per_kernel: dict[str, list[float]] = defaultdict(list)
    top_level_ops = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name].append(event.time_range.elapsed_us())
        elif event.name.startswith("aten::") and event.cpu_parent is None:
            top_level_ops += 1  # an op called from Python (its callees are not counted)
    count = sum(len(v) for v in per_kernel.values())
    total = sum(sum(v) for v in per_kernel.values())
    top = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:top_n]
    return {
        "aten_ops_per_step": top_level_ops / steps,
        "kernels_per_step": count / steps,
        "kernel_us_per_step": total / steps,
        "top_kernels": [
            {"name": name[:120], "calls_per_step": len(v) / steps, "us_per_step": sum(v) / steps} for name, v in top
        ],
    }


def wall_per_step_ms(step: Callable[[], Any], steps: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def uncaptured(decoder: FastDecoder) -> Callable[[], None]:
    """The compiled step run outside its graph, as traced: decode kernels on, host position frozen
    (anything else fails the step's guards and profiles a recompiled, different graph)."""

    def step() -> None:
        with decode_kernels(), decoder.cache.host_frozen():
            decoder._step_fn()
        decoder.cache.advance_host(1)

    return step


@torch.inference_mode()
def profile_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    model, info, hf_config = load_bench_model(args.model, device, dtype)
    config = model.config
    prompt = torch.randint(4, config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    capacity = args.prompt_len + 4 * args.steps + 16
    report: dict[str, Any] = {"model": info, "prompt_len": args.prompt_len, "steps": args.steps, "modes": {}}

    def record(mode: str, step: Callable[[], Any], kernels: bool = True) -> None:
        for _ in range(3):
            step()  # warm-up: cuBLAS handles, autotuning, allocator
        row: dict[str, Any] = {"wall_ms_per_step": wall_per_step_ms(step, args.steps, device)}
        if kernels:
            row.update(kernel_profile(step, min(args.steps, 8), device, args.top))
        report["modes"][mode] = row
        print(f"[profile] {mode:9s} {json.dumps({k: v for k, v in row.items() if k != 'top_kernels'})}", file=sys.stderr)

    cache = KVCache.from_model_config(config, capacity, dtype=dtype, device=device)
    token = model(prompt, kv_cache=cache)[:, -1:].argmax(-1)

    def eager_step() -> None:
        nonlocal token
        token = model(token, kv_cache=cache)[:, -1:].argmax(-1)

    if not args.compiled_only:
        record("eager", eager_step)
    if args.no_static_cudnn:  # experiment: the static step on the dynamic path's SDPA backends
        import infer_ref.models.common as common

        common.STATIC_SDPA_BACKENDS = common.SDPA_BACKENDS

    if not args.compiled_only:
        static = FastDecoder(model, capacity, device=device, cuda_graph=False)
        static.prefill(prompt)
        record("static", static.step)
        del static
    if device.type == "cuda" and not args.compiled_only:
        graph = FastDecoder(model, capacity, device=device)
        graph.prefill(prompt)
        record("graph", graph.step, kernels=False)
        del graph
    if device.type == "cuda":
        for variant in args.compile or []:
            torch._dynamo.reset()
            t0 = time.perf_counter()
            options = COMPILE_VARIANTS[variant]
            compiled = FastDecoder(model, capacity, device=device, compile=True, compile_options=options)
            report[f"compile_s_{variant}"] = time.perf_counter() - t0
            compiled.prefill(prompt)
            record(f"compiled_{variant}", compiled.step, kernels=False)
            compiled.reset()
            compiled.prefill(prompt)
            record(f"compiled_{variant}_uncaptured", uncaptured(compiled))
            del compiled

    if args.hf:
        from transformers import DynamicCache

        from infer_ref.conformance.oracles.transformers_cache import cache_keyword

        hf = build_hf(hf_config, model, device, dtype)
        keyword = cache_keyword(hf)  # read once, outside the profiled step
        out = hf(input_ids=prompt, use_cache=True, **{keyword: DynamicCache(config=hf.config)})
        hf_token = out.logits[:, -1:].argmax(-1)
        past = out[keyword]

        def hf_step() -> None:
            nonlocal hf_token, past
            o = hf(input_ids=hf_token, use_cache=True, **{keyword: past})
            hf_token, past = o.logits[:, -1:].argmax(-1), o[keyword]

        record("hf", hf_step)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument(
        "--compile", nargs="*", choices=sorted(COMPILE_VARIANTS),
        help="also profile the torch.compile'd step with these Inductor option sets (COMPILE_VARIANTS)",
    )
    ap.add_argument("--no-static-cudnn", action="store_true", help="experiment: static step without cuDNN SDPA")
    ap.add_argument("--hf", action="store_true", help="also profile transformers' forward loop")
    ap.add_argument("--top", type=int, default=10, help="how many of the costliest kernels to list per mode")
    ap.add_argument("--compiled-only", action="store_true", help="profile only the --compile variants (and --hf)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    report = {"environment": environment(device), **profile_model(args, device, dtype)}
    for mode, row in report["modes"].items():
        print(f"\n## {args.model} {mode}: {row['wall_ms_per_step']:.3f} ms/step wall", end="")
        if "kernels_per_step" in row:
            print(
                f", {row['aten_ops_per_step']:.0f} ops from Python, {row['kernels_per_step']:.0f} kernels, "
                f"{row['kernel_us_per_step']:.0f} us of kernels per step"
            )
            for k in row["top_kernels"]:
                print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name']}")
        else:
            print()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
