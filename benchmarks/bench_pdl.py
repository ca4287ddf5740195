"""Programmatic dependent launch inside a CUDA graph: chains of tiny kernels and of GEMVs, PDL off and on.

What ``infer_ref/fast/kernels/common.py`` relies on, measured: a graph of 160 dependent one-block kernels,
and chains of 24 matrix-vector products (distinct weights, so they stream from HBM, not L2) with
PDL off, on, and on with the first weight tile loaded before the grid-dependency wait.
``PYTHONPATH=. python benchmarks/bench_pdl.py`` on a Hopper GPU (about 20 s); the H100 figures are
in ``benchmarks/log/h100_pdl_probe.txt``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

K = 2048
CHAIN = 24


@triton.jit
def _add_one(x_ptr, PDL: tl.constexpr):  # type: ignore[no-untyped-def]
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = tl.arange(0, 1024)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)


@triton.jit
def _gemv(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, out_ptr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * K + cols[None, :]
    if PREFETCH:
        w0 = tl.load(w_ptrs)  # constant data: may be read before the wait
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    start = 0
    if PREFETCH:
        acc += w0.to(tl.float32) * tl.load(x_ptr + cols).to(tl.float32)[None, :]
        start = 1
    for t in range(start, K // BLOCK_K):
        w = tl.load(w_ptrs + t * BLOCK_K)
        acc += w.to(tl.float32) * tl.load(x_ptr + t * BLOCK_K + cols).to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, 1).to(tl.bfloat16))


def graph_us(fn: Callable[[], None], reps: int = 50) -> float:
    """Microseconds per replay of ``fn`` captured in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def tiny_chain(pdl: bool) -> None:
    x = torch.zeros(1024, device="cuda")

    def chain() -> None:
        for _ in range(160):
            _add_one[(1,)](x, PDL=pdl, launch_pdl=pdl)

    us = graph_us(chain)
    print(f"tiny chain pdl={pdl}: {us / 160:.2f} us per kernel; x[0]={x[0].item():.0f} (expected multiple of 160)")


def gemv_chains(n: int) -> None:
    weights = [torch.randn(n, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(CHAIN)]
    x = torch.randn(K, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(CHAIN)]
    expected = [w.float() @ x.float() for w in weights]
    for block_n, block_k in ((16, 256), (32, 128), (8, 512)):
        for pdl, prefetch in ((False, False), (True, False), (True, True)):

            def chain(bn: int = block_n, bk: int = block_k, pdl: bool = pdl, pre: bool = prefetch) -> None:
                for w, o in zip(weights, outs, strict=True):
                    _gemv[(n // bn,)](x, w, o, K, bn, bk, pdl, pre, num_warps=4, launch_pdl=pdl)

            us = graph_us(chain) / CHAIN
            err = max((o.float() - e).abs().max().item() for o, e in zip(outs, expected, strict=True))
            print(
                f"gemv N={n} bn={block_n} bk={block_k} pdl={pdl} prefetch={prefetch}: {us:.2f} us, "
                f"{n * K * 2 / us / 1e3:.0f} GB/s, err {err:.1e}"
            )

    def cublas() -> None:
        for w, o in zip(weights, outs, strict=True):
            torch.mv(w, x, out=o)

    us = graph_us(cublas) / CHAIN
    print(f"cublas mv N={n}: {us:.2f} us, {n * K * 2 / us / 1e3:.0f} GB/s")


def main() -> None:
    for pdl in (False, True):
        tiny_chain(pdl)
    for n in (2048, 3072, 16384):
        gemv_chains(n)


if __name__ == "__main__":
    main()
