"""The context sweep of ``decode_compare.py``: fast-step decoders, one measured point per context, table and plot.

A point is one (model, cache type, context): the fast step's decode tokens/s through
``generate(decode=decoder)`` (median over repeats), its effective bandwidth, and its teacher-forced
agreement with the float32 reference at that context (:mod:`benchmarks.teacher_forced`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.accuracy import Agreement, within_margin
from benchmarks.bench_utils import NullDecoder, kv_bytes_attended, median
from benchmarks.teacher_forced import FastPath, Reference, path_agreement
from infer_ref.engine import FastDecoder
from infer_ref.engine.generate import generate
from infer_ref.sampling import SamplingParams

CACHES = ("static", "paged")


def build_fast_decoder(
    model: nn.Module, max_seq_len: int, cache: str, *, block_size: int, device: torch.device, compile: bool
) -> FastDecoder:
    """A ``FastDecoder`` over a ``cache`` ("static" or "paged") cache of ``max_seq_len`` positions."""
    if compile:
        torch._dynamo.reset()  # a fresh compile per decoder, not recompilations of one cached frame
    return FastDecoder(model, max_seq_len, device=device, compile=compile, cache=cache, block_size=block_size)


def step_kind(decoder: FastDecoder) -> str:
    """How the decoder's step runs: "compiled" (torch.compile + CUDA graph), "graph" or "uncaptured"."""
    if decoder.compiled:
        return "compiled"
    return "graph" if decoder.use_cuda_graph else "uncaptured"


def decode_tokens_per_s(
    model: nn.Module, decoder: FastDecoder, prompt: list[int], new_tokens: int, device: torch.device,
    warmup: int, repeats: int,
) -> float:
    """Decode tokens/s of ``generate(decode=decoder)``: (new_tokens - 1) / median decode time over ``repeats``."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    runs = [generate(model, NullDecoder(), prompt, params, device=device, decode=decoder)
            for _ in range(warmup + repeats)]
    return (new_tokens - 1) / median([r.timing.decode_time_s for r in runs[warmup:]])


def measure_point(
    model: nn.Module, decoder: FastDecoder, cache: str, prompt: list[int], reference: Reference | None,
    *, new_tokens: int, device: torch.device, warmup: int, repeats: int, weight_bytes: int, copy_GBps: float,
) -> dict[str, Any]:
    """Tokens/s, effective bandwidth and (with a reference) teacher-forced agreement at one context."""
    tps = decode_tokens_per_s(model, decoder, prompt, new_tokens, device, warmup, repeats)
    itemsize = next(model.parameters()).element_size()
    kv = kv_bytes_attended(model.config, len(prompt), new_tokens - 1, itemsize)  # type: ignore[arg-type]
    gbps = (weight_bytes + kv) * tps / 1e9
    point: dict[str, Any] = {
        "cache": cache, "context": len(prompt), "step": step_kind(decoder), "max_seq_len": decoder.max_seq_len,
        "tokens_per_s": tps, "kv_bytes_per_token_mean": kv, "bandwidth_GBps": gbps,
        "pct_copy_bw": 100 * gbps / copy_GBps, "accuracy": None,
    }
    if reference is not None:
        point["accuracy"] = path_agreement(FastPath(decoder), reference).as_dict()
    return point


def judge(accuracy: dict[str, Any] | None, baseline: dict[str, Any] | None, margin: float) -> bool | None:
    """Whether a path "counts": agreement within ``margin`` x the transformers bf16 baseline (None: unknown)."""
    if accuracy is None or baseline is None:
        return None
    return within_margin(Agreement(**accuracy), Agreement(**baseline), margin)


def add_vs_static(points: list[dict[str, Any]]) -> None:
    """Paged points get ``vs_static``: their tokens/s over the static point's at the same context."""
    static = {p["context"]: p["tokens_per_s"] for p in points if p["cache"] == "static" and "tokens_per_s" in p}
    for p in points:
        if p["cache"] != "static" and "tokens_per_s" in p and p["context"] in static:
            p["vs_static"] = p["tokens_per_s"] / static[p["context"]]


# -- report --------------------------------------------------------------------------------------


def fmt_num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def fmt_yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def sweep_markdown(rows: list[dict[str, Any]], margin: float) -> str:
    """One line per (model, cache, context); skipped points say so."""
    lines = [
        "| model | cache | step | context | tok/s | GB/s | % of copy BW | vs static | mean KL | max abs Δlogprob "
        "| transformers mean KL | transformers max abs Δlogprob | counts |",
        "|---" * 13 + "|",
    ]
    for row in rows:
        for p in row.get("sweep", []):
            head = f"| {row['model']} | {p['cache']} | {p.get('step', '-')} | {p['context']} |"
            if "skipped" in p:
                lines.append(head + f" skipped: {p['skipped']} |" + " |" * 8)
                continue
            acc, hf = p.get("accuracy") or {}, p.get("hf_accuracy") or {}
            lines.append(
                head + f" {p['tokens_per_s']:.1f} | {p['bandwidth_GBps']:.0f} | {p['pct_copy_bw']:.1f}% "
                f"| {fmt_num(p.get('vs_static'), '.2f')} | {fmt_num(acc.get('mean_kl'), '.3g')} "
                f"| {fmt_num(acc.get('max_abs_dlogprob'), '.3g')} | {fmt_num(hf.get('mean_kl'), '.3g')} "
                f"| {fmt_num(hf.get('max_abs_dlogprob'), '.3g')} | {fmt_yes_no(p.get('counts'))} |"
            )
    lines += ["", f"Accuracy: teacher-forced against the float32 reference over the decode steps; a point counts when "
              f"its mean KL and max |Δlogprob| are each <= the transformers loop's (same dtype) at that context x {margin} "
              "('-': transformers not run there). vs static: paged tok/s / static tok/s at the same context."]
    return "\n".join(lines)


def plot_sweep(rows: list[dict[str, Any]], path: Path) -> bool:
    """tok/s and % of copy bandwidth against context (log x), one line per model x cache; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[compare] matplotlib is not installed: no plot", file=sys.stderr)
        return False
    fig, (ax_tps, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in rows:
        for cache in CACHES:
            points = sorted((p for p in row.get("sweep", []) if p["cache"] == cache and "tokens_per_s" in p),
                            key=lambda p: p["context"])
            if not points:
                continue
            label = f"{row['model']} {cache} ({points[0]['step']})"
            xs = [p["context"] for p in points]
            ax_tps.plot(xs, [p["tokens_per_s"] for p in points], marker="o", label=label)
            ax_bw.plot(xs, [p["pct_copy_bw"] for p in points], marker="o", label=label)
    contexts = sorted({p["context"] for row in rows for p in row.get("sweep", []) if "tokens_per_s" in p})
    for ax, ylabel in ((ax_tps, "decode tokens/s"), (ax_bw, "% of device copy bandwidth")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.minorticks_off()
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_tps.legend(fontsize=8)
    fig.suptitle("Fast decode step against context, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
