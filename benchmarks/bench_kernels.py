"""Paged decode attention: the Triton split-K kernel against gather + SDPA.

One decode query per row (Llama-3.2-1B attention shape by default: 32 query heads, 8 KV heads,
head_dim 64, bfloat16) over a paged pool with randomly permuted physical blocks, at each context
length. Methods:

- ``paged_kernel``:     ``paged_decode_attention`` reading K/V through the block table (Triton on CUDA)
- ``identity_kernel``:  the same kernel reading a contiguous ``[B, Hkv, S, D]`` layer in place
                        through ``contiguous_layer_as_paged`` (how a static cache would use it)
- ``gather_sdpa``:      ``gather_paged_kv`` (copy the prefix out) then ``scaled_dot_product_attention``
- ``contiguous_sdpa``:  SDPA on K/V that are already contiguous (no gather): the floor for SDPA

Each call reads one of several distinct K/V copies in turn (enough that a round reads four L2
caches' worth, so the data come from HBM as in a real decode step, where weights and other layers
evict them). Times are CUDA-event medians of ``--repeats`` timed runs of about ``--iters`` calls,
twice: eager (launch and Python overhead included, which dominates short contexts at batch 1) and
replayed from a CUDA graph of one round (the GPU time a captured decode step pays). ``GB/s``
counts the K and V bytes a call must read once, over the graph time. Prints a table and writes
JSON to ``--out``.

``python benchmarks/bench_kernels.py --out kernels.json``
Dry run on a CPU (the reference path, small contexts): ``--device cpu --contexts 16 64 --iters 2``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import DTYPES, environment, median, pick_device, sync
from infer_ref.fast.kernels import gather_paged_kv, paged_decode_attention
from infer_ref.fast.kernels.attention import contiguous_layer_as_paged
from infer_ref.fast.kernels.common import HAVE_TRITON


def time_call(fn: Callable[[], Any], device: torch.device, iters: int, repeats: int) -> float:
    """Median seconds per call over ``repeats`` timed loops of ``iters`` calls (after a warm-up)."""
    for _ in range(3):
        fn()
    sync(device)
    per_call = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            per_call.append((time.perf_counter() - t0) / iters)
    return median(per_call)


L2_MULTIPLE = 4  # each timed round reads at least this many L2 caches' worth of distinct K/V
MAX_COPIES = 512


def copies_for(kv_bytes: int, device: torch.device) -> int:
    """Distinct K/V copies to rotate through, so repeated calls read HBM, not a warm L2.

    One call's K/V at 16K context (34 MB here) fits in an H100's 50 MB or an H200's 60 MB L2: timing
    the same tensors over and over would report L2 bandwidth.
    """
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20)
    return max(1, min(MAX_COPIES, -(-L2_MULTIPLE * l2 // kv_bytes)))


def graph_of(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``fn`` (one round over the copies) captured in a CUDA graph; the returned callable replays it."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up (compilation, allocator) off the capture
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def bench_context(args: argparse.Namespace, context: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    b, h, hkv, d, bs = args.batch, args.heads, args.kv_heads, args.head_dim, args.block_size
    gen = torch.Generator(device=device).manual_seed(context)
    blocks_per_row = -(-context // bs)
    num_blocks = b * blocks_per_row
    kv_bytes = 2 * b * context * hkv * d * torch.empty((), dtype=dtype).element_size()
    copies = copies_for(kv_bytes, device)
    pool_shape = (copies, num_blocks, bs, hkv, d)
    k_pools = torch.randn(pool_shape, generator=gen, device=device, dtype=dtype)
    v_pools = torch.randn(pool_shape, generator=gen, device=device, dtype=dtype)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(b, blocks_per_row).to(torch.int32)
    seq_lens = torch.full((b,), context, dtype=torch.int32, device=device)
    q = torch.randn(b, h, d, generator=gen, device=device, dtype=dtype)
    scale = d**-0.5
    # The same K/V contiguous [B, Hkv, S, D], and in a layer padded to a multiple of bs (identity view).
    k_contig = [gather_paged_kv(k_pools[r], tables, context).contiguous() for r in range(copies)]
    v_contig = [gather_paged_kv(v_pools[r], tables, context).contiguous() for r in range(copies)]
    padded = blocks_per_row * bs
    identity = []
    for r in range(copies):
        k_layer = torch.zeros(b, hkv, padded, d, device=device, dtype=dtype)
        v_layer = torch.zeros_like(k_layer)
        k_layer[:, :, :context], v_layer[:, :, :context] = k_contig[r], v_contig[r]
        (k_ident, ident_tables), (v_ident, _) = contiguous_layer_as_paged(k_layer, bs), contiguous_layer_as_paged(v_layer, bs)
        identity.append((k_ident, v_ident, ident_tables))

    def sdpa(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)[:, :, 0]

    methods: dict[str, Callable[[int], torch.Tensor]] = {
        "paged_kernel": lambda r: paged_decode_attention(q, k_pools[r], v_pools[r], tables, seq_lens, scale),
        "identity_kernel": lambda r: paged_decode_attention(
            q, identity[r][0], identity[r][1], identity[r][2], seq_lens, scale
        ),
        "gather_sdpa": lambda r: sdpa(gather_paged_kv(k_pools[r], tables, context), gather_paged_kv(v_pools[r], tables, context)),
        "contiguous_sdpa": lambda r: sdpa(k_contig[r], v_contig[r]),
    }
    expected = methods["contiguous_sdpa"](copies - 1).float()
    row: dict[str, Any] = {"context": context, "kv_bytes": kv_bytes, "copies": copies, "methods": {}}
    rounds = max(1, args.iters // copies)
    for name, fn in methods.items():
        max_err = (fn(copies - 1).float() - expected).abs().max().item()  # each method answers the same question

        def one_round(fn: Callable[[int], torch.Tensor] = fn) -> None:
            for r in range(copies):
                fn(r)

        eager = time_call(one_round, device, rounds, args.repeats) / copies
        result = {"eager_us": eager * 1e6, "max_abs_diff_vs_sdpa": max_err}
        if device.type == "cuda":
            graph = time_call(graph_of(one_round, device), device, rounds, args.repeats) / copies
            result.update(graph_us=graph * 1e6, graph_GBps=kv_bytes / graph / 1e9)
        row["methods"][name] = result
    for mode in ("eager", "graph"):
        if f"{mode}_us" in row["methods"]["paged_kernel"]:
            gather, kernel = row["methods"]["gather_sdpa"][f"{mode}_us"], row["methods"]["paged_kernel"][f"{mode}_us"]
            row[f"{mode}_speedup_vs_gather_sdpa"] = gather / kernel
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    """µs per call as ``graph (GB/s) / eager``; the last columns: kernel speedup over gather + SDPA."""
    names = list(rows[0]["methods"])
    print("| context | " + " | ".join(f"{n}: graph µs (GB/s) / eager µs" for n in names) + " | speedup graph | speedup eager |")
    print("|---:|" + "---:|" * (len(names) + 2))
    for r in rows:
        cells = []
        for n in names:
            m = r["methods"][n]
            graph = f"{m['graph_us']:.1f} ({m['graph_GBps']:.0f})" if "graph_us" in m else "-"
            cells.append(f"{graph} / {m['eager_us']:.1f}")
        speedups = [f"{r[k]:.2f}x" if k in r else "-" for k in ("graph_speedup_vs_gather_sdpa", "eager_speedup_vs_gather_sdpa")]
        print(f"| {r['context']} | " + " | ".join(cells) + " | " + " | ".join(speedups) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 4096, 16384])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    rows = [bench_context(args, c, device, dtype) for c in args.contexts]
    print_table(rows)
    report = {
        "benchmark": "paged_decode_attention",
        "shape": {"batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "block_size": args.block_size, "dtype": args.dtype},
        "kernel": "triton" if (device.type == "cuda" and HAVE_TRITON) else "reference",
        "timing": {"iters": args.iters, "repeats": args.repeats, "l2_multiple": L2_MULTIPLE, "clock": "cuda events" if device.type == "cuda" else "perf_counter"},
        "environment": environment(device),
        "results": rows,
    }  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
