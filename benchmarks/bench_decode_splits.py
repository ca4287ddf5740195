"""Decode attention split settings over 16 Llama-3.2-1B-shaped static layers (batch 1), in one CUDA graph.

For 128, 4096 and 16384 positions: the split heuristic (``decode_num_splits``) against more splits
and other tiles; microseconds per layer (split and combine kernels) and GB/s of K/V read.
``PYTHONPATH=. python benchmarks/bench_decode_splits.py`` on a GPU. The H100 figures in
``benchmarks/log/h100_decode_attention_splits.txt`` were taken under the earlier two-tile rule, so
a row without an override there shows that rule's count; the one-tile rule now in
``decode_num_splits`` gives 64 splits at 4096 positions.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_pdl import graph_us
from infer_ref.fast.kernels.attention import (
    contiguous_layer_as_paged,
    decode_num_splits,
    paged_decode_attention_triton,
)

B, H, HKV, D, LAYERS = 1, 32, 8, 64, 16
# (keys per tile, warps, stages, splits as a multiple of the heuristic's; 0: the heuristic's)
SETTINGS = [(64, 4, 2, 0), (64, 4, 2, 2), (32, 4, 2, 0), (32, 2, 2, 2), (32, 4, 3, 4), (64, 4, 3, 0), (16, 2, 2, 4)]


def every_layer(
    layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], q: torch.Tensor, lens: torch.Tensor,
    splits: int, block_n: int, warps: int, stages: int,
) -> None:  # fmt: skip
    for k_pool, v_pool, tables in layers:
        paged_decode_attention_triton(
            q, k_pool, v_pool, tables, lens, 0.125, None, splits, block_n=block_n, num_warps=warps, num_stages=stages
        )


def main() -> None:
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for ctx in (128, 4096, 16384):
        s = -(-(ctx + 64) // 64) * 64
        layers = []
        for _ in range(LAYERS):
            k = torch.randn(B, HKV, s, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, HKV, s, D, device="cuda", dtype=torch.bfloat16)
            (k_pool, tables), (v_pool, _) = contiguous_layer_as_paged(k, 64), contiguous_layer_as_paged(v, 64)
            layers.append((k_pool, v_pool, tables))
        q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
        lens = torch.tensor([ctx], device="cuda", dtype=torch.int32)
        k0, v0, t0 = layers[0]
        expected = paged_decode_attention_triton(q, k0, v0, t0, lens, 0.125, None, 1)
        for block_n, warps, stages, times in SETTINGS:
            base = decode_num_splits(B, HKV, s, block_n, sms)
            splits = base * times if times else base

            run = functools.partial(every_layer, layers, q, lens, splits, block_n, warps, stages)
            out = paged_decode_attention_triton(q, k0, v0, t0, lens, 0.125, None, splits, block_n=block_n, num_warps=warps, num_stages=stages)
            err = (out.float() - expected.float()).abs().max().item()
            us = graph_us(run) / LAYERS
            print(
                f"ctx {ctx} block_n {block_n} warps {warps} stages {stages} splits {splits}: {us:.2f} us/layer "
                f"(split+combine), {2 * HKV * ctx * D * 2 / us / 1e3:.0f} GB/s, err {err:.1e}"
            )


if __name__ == "__main__":
    main()
