"""Fused decode attention against the chain of kernels it replaces, per layer, under a CUDA graph.

For each family shape (Llama-3.2-1B: H=32, Hkv=8, D=64, no per-head norm; Qwen3-1.7B: H=16, Hkv=8,
D=128, Llama-formula q/k norms; Gemma-3-1b: H=4, Hkv=1, D=256, Gemma-formula norms) and each
context in {128, 1024, 4096, 16384} (positions already in the cache; the new token is one more),
one decode step of ``--layers`` layers, each with its own paged K/V pools (blocks of 16, a shuffled
table), batch ``--batch``, bf16:

- ``fused``: :func:`~infer_ref.fast.kernels.attention.decode_attention` per layer, one kernel
  from the projected q/k/v to the attention output (norms, RoPE, K/V store, split attention and
  its combine);
- ``unfused``: what it replaces, the eager chain a layer ran before: the per-head norms
  (``rms_norm``) and RoPE (``apply_rope_to_pair``, as the model's eager path) in torch, ``store_kvcache`` (the Triton store), then
  ``paged_decode_attention`` (the same attention kernel with its prep stages off, which now also
  combines in one launch: the old separate combine kernel is gone, so this side is, if anything,
  one kernel shorter than the chain before). The step's slot mapping is computed once per step,
  not per layer, as a cache does.

Both steps are captured in one CUDA graph each and replayed; the time is the median over
``--repeats`` loops of ``--iters`` replays (CUDA events), divided by the layers: microseconds per
layer, launch overhead excluded as in the captured decode step. ``GB/s`` counts the K/V read by
attention (``2 * B * ctx * Hkv * D * 2`` bytes) per fused layer. Before timing, the two steps'
outputs are compared (they share definitions: within bf16 rounding of the reference).
Sixteen layers' pools at 4096 positions and more exceed an H100's 50 MB L2, so those contexts
read HBM; at 128 positions the whole step's K/V is L2-resident, as in a real short-context step.

    PYTHONPATH=. python benchmarks/bench_decode_attention.py --json OUT/decode_attention.json   # an H100: ~1 minute

``--dry-run``: the same harness on a CPU with tiny contexts, eager timing (the dispatching entry
points take their torch references there); the tests use it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_kernels import graph_of, time_call
from benchmarks.bench_utils import environment, pick_device
from infer_ref.fast.kernels.attention import (
    decode_attention,
    decode_attention_triton,
    paged_decode_attention,
    slots_through_tables,
)
from infer_ref.fast.kernels.common import pdl_launch
from infer_ref.fast.kernels.store import store_kvcache
from infer_ref.norm import NormSpec, rms_norm
from infer_ref.rotary import apply_rope_to_pair

# (num_heads, num_kv_heads, head_dim, per-head norm formula or None)
FAMILIES: dict[str, tuple[int, int, int, str | None]] = {
    "llama": (32, 8, 64, None),
    "qwen3": (16, 8, 128, "llama"),
    "gemma3": (4, 1, 256, "gemma"),
}
CONTEXTS = (128, 1024, 4096, 16384)
BLOCK_SIZE = 16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Layer:
    """One layer's pools ``[num_blocks, bs, Hkv, D]`` and per-head norms."""

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    q_norm: NormSpec | None
    k_norm: NormSpec | None


@dataclass
class Step:
    """The inputs of one decode step, shared by the layers (a real step has one qkv per layer; the
    attention's cost does not depend on which)."""

    q: torch.Tensor  # [B, H, D], a view of the packed projection output
    k: torch.Tensor  # [B, Hkv, D]
    v: torch.Tensor
    cos: torch.Tensor  # [B, D]
    sin: torch.Tensor
    tables: torch.Tensor  # [B, M] int32
    seq_lens: torch.Tensor  # [B] int32, after the new token
    scale: float
    layers: list[Layer]


def build_step(family: str, context: int, batch: int, layers: int, dtype: torch.dtype, device: torch.device) -> Step:
    h, hkv, d, norm = FAMILIES[family]
    g = torch.Generator(device=device).manual_seed(context + 7 * layers)
    length = context + 1  # the new token's position is ``context``
    blocks_per_row = -(-length // BLOCK_SIZE)
    num_blocks = batch * blocks_per_row
    tables = torch.randperm(num_blocks, generator=g, device=device).view(batch, blocks_per_row).to(torch.int32)
    qkv = torch.randn(batch, (h + 2 * hkv) * d, generator=g, device=device).to(dtype)
    angles = context * (1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)))
    emb = torch.cat((angles, angles))[None].expand(batch, -1)
    all_layers = []
    for _ in range(layers):
        k_pool = torch.randn(num_blocks, BLOCK_SIZE, hkv, d, generator=g, device=device).to(dtype)
        v_pool = torch.randn(num_blocks, BLOCK_SIZE, hkv, d, generator=g, device=device).to(dtype)
        specs = [None, None]
        if norm is not None:
            gemma = norm == "gemma"
            specs = [
                NormSpec((0.2 * torch.randn(d, generator=g, device=device) + (0.0 if gemma else 1.0)).to(dtype), 1e-6, gemma)
                for _ in range(2)
            ]
        all_layers.append(Layer(k_pool, v_pool, specs[0], specs[1]))
    return Step(
        q=qkv[:, : h * d].view(batch, h, d), k=qkv[:, h * d : (h + hkv) * d].view(batch, hkv, d),
        v=qkv[:, (h + hkv) * d :].view(batch, hkv, d), cos=emb.cos().to(dtype), sin=emb.sin().to(dtype),
        tables=tables, seq_lens=torch.full((batch,), length, dtype=torch.int32, device=device),
        scale=d**-0.5, layers=all_layers,
    )  # fmt: skip


def fused(step: Step, knobs: dict[str, Any] | None = None) -> list[torch.Tensor]:
    """The fused kernel per layer; ``knobs``: launch knobs of the kernel (None: the dispatching call)."""
    outs = []
    for layer in step.layers:
        args = (
            step.q, step.k, step.v, step.cos, step.sin, layer.k_pool, layer.v_pool, step.tables, step.seq_lens,
            step.scale, None, layer.q_norm, layer.k_norm,
        )  # fmt: skip
        if knobs is None:
            outs.append(decode_attention(*args))  # the dispatching entry point, as the models call it
        else:
            outs.append(decode_attention_triton(*args, **knobs))
    return outs


def unfused(step: Step) -> list[torch.Tensor]:
    """The eager chain: norms and RoPE in torch, the store kernel, the attention kernel (prep off)."""
    slots = slots_through_tables(step.tables, (step.seq_lens.long() - 1)[:, None], BLOCK_SIZE).reshape(-1)  # once per step
    cos, sin = step.cos[:, None], step.sin[:, None]  # [B, T=1, D]
    outs = []
    for layer in step.layers:
        q, k = step.q[:, :, None], step.k[:, :, None]  # [B, H, 1, D]
        if layer.q_norm is not None and layer.k_norm is not None:
            q = rms_norm(q, layer.q_norm.weight, layer.q_norm.eps, unit_offset=layer.q_norm.unit_offset)
            k = rms_norm(k, layer.k_norm.weight, layer.k_norm.eps, unit_offset=layer.k_norm.unit_offset)
        q, k = apply_rope_to_pair(q, k, cos, sin)  # as the model's eager path rotates them
        store_kvcache(k[:, :, 0], step.v, layer.k_pool, layer.v_pool, slots)
        outs.append(paged_decode_attention(q[:, :, 0], layer.k_pool, layer.v_pool, step.tables, step.seq_lens, step.scale))
    return outs


def time_replays(fn: Callable[[], Any], device: torch.device, iters: int, repeats: int) -> float:
    """Median seconds per call of ``fn``: replays of its CUDA graph on a GPU, eager calls elsewhere."""
    return time_call(graph_of(fn, device) if device.type == "cuda" else fn, device, iters, repeats)


def bench_one(family: str, context: int, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    h, hkv, d, norm = FAMILIES[family]
    step = build_step(family, context, args.batch, args.layers, dtype, device)
    # Agreement (and the first calls, which compile the kernels and allocate the counters before
    # any capture): both write the same slots, neither reads them back.
    want = unfused(step)[0].float()
    tol = 2e-2 if dtype != torch.float32 else 1e-5

    def agrees(out: torch.Tensor) -> tuple[bool, float]:
        got = out.float()
        ok = bool(torch.isfinite(got).all()) and bool(((got - want).abs() <= tol + tol * want.abs()).all())
        return ok, float((got - want).abs().max())

    agree, max_err = agrees(fused(step)[0])
    variants: list[tuple[str, Callable[[], Any]]] = [("fused", lambda: fused(step)), ("unfused", lambda: unfused(step))]
    on_kernel = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    disagreeing, failing = [], {}
    for knob in args.knobs if on_kernel else []:
        try:  # also the variant's compile, before any capture
            ok = agrees(fused(step, parse_knob(knob))[0])[0]
        except Exception as exc:  # a launch the GPU cannot run (shared memory, registers): reported, not timed
            failing[knob] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        variants.append((f"fused_{knob}", lambda knob=knob: fused(step, parse_knob(knob))))
        if not ok:
            disagreeing.append(knob)
    row: dict[str, Any] = {
        "family": family, "context": context, "batch": args.batch, "layers": args.layers, "heads": h, "kv_heads": hkv,
        "head_dim": d, "norm": norm, "max_abs_diff": max_err, "agree": agree and not disagreeing,
        "disagreeing_knobs": disagreeing, "failing_knobs": failing,
    }  # fmt: skip
    times = {}
    for name, fn in variants:
        times[name] = time_replays(fn, device, args.iters, args.repeats) / args.layers * 1e6
    row["variants_us"] = {name: t for name, t in times.items() if name not in ("fused", "unfused")}
    kv_bytes = 2 * args.batch * (context + 1) * hkv * d * torch.empty((), dtype=dtype).element_size()
    row.update(
        fused_us=times["fused"], unfused_us=times["unfused"], speedup=times["unfused"] / times["fused"],
        fused_GBps=kv_bytes / (times["fused"] * 1e-6) / 1e9,
    )  # fmt: skip
    return row


INT_KNOBS = ("num_splits", "block_n", "first_n", "num_warps", "num_stages", "heads_per_program")


def parse_knob(text: str) -> dict[str, Any]:
    """``"num_warps=2,block_n=32,preload=1"`` -> ``{"num_warps": 2, "block_n": 32, "preload": True}``
    (integer values; ``preload`` 0 or 1)."""
    knobs: dict[str, Any] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name == "preload" and value in ("0", "1"):
            knobs[name] = value == "1"
        elif name in INT_KNOBS and value.lstrip("-").isdigit():
            knobs[name] = int(value)
        else:
            raise ValueError(f"--knobs: expected NAME=INT with NAME in {', '.join(INT_KNOBS)}, or preload=0|1; got {part!r}")
    return knobs


def table(rows: list[dict[str, Any]]) -> str:
    names = sorted({name for r in rows for name in r.get("variants_us", {})})
    extra = "".join(f" {name.removeprefix('fused_'):>20}" for name in names)
    lines = [
        f"{'family':<8} {'context':>7} {'fused us':>9} {'unfused us':>10} {'speedup':>8} {'fused GB/s':>10} {'max|diff|':>9}{extra}",
    ]
    for r in rows:
        cells = "".join(f" {r.get('variants_us', {}).get(name, float('nan')):>20.2f}" for name in names)
        lines.append(
            f"{r['family']:<8} {r['context']:>7} {r['fused_us']:>9.2f} {r['unfused_us']:>10.2f} {r['speedup']:>7.2f}x "
            f"{r['fused_GBps']:>10.0f} {r['max_abs_diff']:>9.2e}{cells}{'' if r['agree'] else '  DISAGREE'}"
        )
    return "\n".join(lines)


def variant_lines(rows: list[dict[str, Any]]) -> str:
    """Each row's knob variants, fastest first: ``family context us knobs``."""
    lines = []
    for r in rows:
        ranked = sorted(r.get("variants_us", {}).items(), key=lambda kv: kv[1])
        lines += [f"{r['family']:<8} {r['context']:>7} {us:>8.2f}  {name.removeprefix('fused_')}" for name, us in ranked]
        lines += [f"{r['family']:<8} {r['context']:>7} {'failed':>8}  {knob}: {why}" for knob, why in r.get("failing_knobs", {}).items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=16, help="layers per step (distinct pools)")
    p.add_argument("--iters", type=int, default=20, help="replays per timed loop")
    p.add_argument("--repeats", type=int, default=25, help="timed loops (median)")
    p.add_argument("--knobs", nargs="*", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                   help="also time the kernel with these launch knobs, e.g. num_warps=2 block_n=32,num_splits=8")
    p.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny contexts, 2 layers, few repeats")
    args = p.parse_args(argv)
    if args.dry_run:
        args.device = args.device or "cpu"
        if args.contexts == list(CONTEXTS):
            args.contexts = [16, 40]
        args.layers, args.iters, args.repeats = min(args.layers, 2), 1, 2
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    rows = []
    for family in args.families:
        for context in args.contexts:
            rows.append(bench_one(family, context, args, device, dtype))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    report = {
        "benchmark": "decode_attention", "environment": environment(device), "dtype": args.dtype,
        "pdl": pdl_launch(device), "block_size": BLOCK_SIZE, "dry_run": args.dry_run, "rows": rows,
    }  # fmt: skip
    print()
    print(table(rows))
    if any(r.get("variants_us") or r.get("failing_knobs") for r in rows):
        print("\nknob variants, fastest first:")
        print(variant_lines(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    if not all(r["agree"] and math.isfinite(r["fused_us"]) for r in rows):
        print("the fused and unfused steps disagree (see max|diff|)", file=sys.stderr)
    return report


if __name__ == "__main__":
    sys.exit(0 if all(r["agree"] for r in main()["rows"]) else 1)
