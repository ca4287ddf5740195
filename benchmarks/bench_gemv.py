"""Decode projections: the Triton matrix-vector kernels against cuBLAS, and a sweep of launch configs.

For every projection of the three real shapes (Llama-3.2-1B, Qwen3-1.7B, Gemma-3-1b: qkv, o,
gate_up, down, LM head; shapes shared between models are measured once) and for 1 and 4 rows:

- ``cublas``: the reference (``F.linear``; for gate_up the eager gated MLP: ``F.linear``, the
  activation and the product, three kernels — what the gated kernel replaces);
- every candidate :class:`GemvConfig` of the sweep, each first checked against a float64 oracle
  (``infer_ref.conformance.oracles.gemv``: the exact product rounded where the kernel rounds, within
  the float32-accumulation bound); a config that fails is reported and never timed.

Timing: ~50 calls captured in one CUDA graph and replayed, CUDA-event medians per call, so launch
overhead is excluded as in the captured decode step. Successive calls read different copies of the
weight, enough copies that one round reads four L2 caches' worth (an H100 has 50 MB of L2: a 12 MB
qkv weight read over and over would come from L2 and report L2 bandwidth). Rotating copies rather
than flushing L2 between calls keeps the graph free of flush kernels whose time would have to be
subtracted, and matches a real step, where sixteen layers' distinct weights evict each other.
``GB/s`` counts weight + input + output bytes once; ``%copy`` compares with a measured
device-to-device copy (bytes read plus written).

Prints a table per case; per model, the projections of one whole decode step (every layer's qkv, o,
gate_up and down, then the LM head) summed with cuBLAS and with the best configs, as GB/s and % of
copy; the best config per weight shape (batch-1 rows) as a dict literal to paste into
``LINEAR_CONFIGS``/``GATED_CONFIGS`` in ``infer_ref/fast/kernels/gemv/tuning.py`` (keyed by the device's
capability, ``CAPABILITY`` in the literal); and writes JSON with ``--json``.
Batch 1 runs first; past ``--budget-s`` seconds the remaining cases time only the configuration the
dispatch picks and the heuristic's, so the run stays under five minutes.

``--mode chain`` times, per family, the projections of one decoder layer as the model runs them in
a captured decode step: qkv with the input norm folded in (in_norm), o adding its output to the
residual stream (residual; Gemma: out_norm then residual), gate_up with in_norm, down with residual
(Gemma: out_norm too), all ``num_hidden_layers`` layers in one CUDA graph with programmatic
dependent launch, weights rotated over enough copies that they come from HBM. Variants (per layer):

- ``fused``: the kernels with their stages, table configs, ``weight_is_constant=False``;
- ``fused_constant``: the same with ``weight_is_constant=True`` (first weight tile before the wait)
  and ``residual_is_settled=True`` (the residual too), as the models call them;
- ``unfused``: the same kernels without stages, the norms and adds as eager torch ops between them;
- ``compiled_before``: ``torch.compile`` of the layer as the models ran before the stages existed
  (dispatching ``linear``/``gated_mlp`` without stages, so qkv of ``CUBLAS_SHAPES`` takes
  ``F.linear``, and Inductor fuses the norms and adds into its own kernels);
- ``compiled_after``: ``torch.compile`` of the fused layer through the dispatching calls
  (``weight_is_constant=True``, as the models call them).

It also times each projection alone (graph-replayed, rotating copies) plain and with its stages,
so the cost of the in_norm prologue (and of the residual/out_norm epilogue) per shape shows. Every
variant's layer output is compared with the eager reference layer (relative error, reported).

``PYTHONPATH=. python benchmarks/bench_gemv.py --json OUT/gemv.json``  (an H100: about 2-4 minutes)
``PYTHONPATH=. python benchmarks/bench_gemv.py --mode chain --json OUT/gemv_chain.json``  (about 3-6 minutes)
Dry run on a CPU (tiny shapes, 2 configs, the reference standing in for the kernel unless
``TRITON_INTERPRET=1``): ``python benchmarks/bench_gemv.py --device cpu --dry-run`` (``--mode chain``
too; the compiled variants are skipped on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_kernels import copies_for, graph_of, time_call
from benchmarks.bench_utils import DTYPES, d2d_copy_bandwidth, environment, pick_device
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, TINY_CONFIGS
from infer_ref.conformance.oracles.gemv import gated_oracle, linear_oracle, violations
from infer_ref.fast.kernels import gemv
from infer_ref.fast.kernels.common import DeviceProfile, device_profile
from infer_ref.fast.kernels.gemv import GemvConfig, default_config, split_plan, target_programs
from infer_ref.fast.switch import decode_kernels
from infer_ref.norm import NormSpec

CALLS_PER_GRAPH = 50


# -- the model's side: which products a decode step runs, and the stages its blocks fold in ---------
# (the kernels take shapes; which model needs which shapes is the caller's knowledge)


def decode_projections(config: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """The weight shapes ``(N, K, gated)`` a decode step of ``config`` multiplies by, by projection.

    ``qkv`` and ``gate_up`` are the stacked matrices of ``PackedLinear``; ``gate_up`` runs gated.
    """
    e, d = config.hidden_size, config.computed_head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {
        "qkv": (q + 2 * kv, e, False),
        "o": (e, q, False),
        "gate_up": (2 * config.intermediate_size, e, True),
        "down": (e, config.intermediate_size, False),
        "lm_head": (config.vocab_size, e, False),
    }


@dataclasses.dataclass(frozen=True)
class FusedStages:
    """The fused stages a decode projection takes in a model's block (``gemv.linear``'s arguments):
    ``in_norm`` (the block's input norm), ``residual``, ``out_norm`` (Gemma's post-norms), and the
    norms' formula (``unit_offset``: Gemma's ``1 + w``)."""

    in_norm: bool = False
    residual: bool = False
    out_norm: bool = False
    unit_offset: bool = False


def decode_stages(config: ModelConfig) -> dict[str, FusedStages]:
    """Per projection of :func:`decode_projections`, the stages its block folds into it.

    Llama/Qwen (``x + attn(norm(x))``, ``x + mlp(norm(x))``): qkv and gate_up read the normed
    stream (in_norm), o and down add to it (residual). Gemma 3 (``x + post_norm(sublayer(pre_norm(x)))``):
    the same, and o and down normalise their output first (out_norm). The LM head takes none: the
    model applies the final norm itself (one small kernel per step), because an in_norm prologue
    would have each of the LM head's ~16k programs read the whole hidden row once more.
    """
    gemma = config.model_type == "gemma3_text"
    pre = FusedStages(in_norm=True, unit_offset=gemma)
    post = FusedStages(residual=True, out_norm=gemma, unit_offset=gemma)
    return {"qkv": pre, "o": post, "gate_up": pre, "down": post, "lm_head": FusedStages()}



# (block_n, block_k, num_warps, num_stages, path): tile shapes tried, each with several split_k.
TILES = [
    (16, 256, 4, 4, "dot"),
    (32, 128, 4, 4, "dot"),
    (32, 256, 4, 3, "dot"),
    (64, 128, 4, 4, "dot"),
    (64, 256, 8, 3, "dot"),
    (64, 128, 4, 4, "dot_t"),
    (64, 256, 4, 3, "dot_t"),
    (128, 128, 8, 3, "dot_t"),
    (8, 256, 4, 2, "fma"),
    (16, 256, 4, 2, "fma"),
    (32, 128, 4, 2, "fma"),
    (4, 1024, 4, 3, "fma"),
    (8, 512, 4, 3, "fma"),
    (16, 512, 8, 3, "fma"),
]
# The multiply-and-add path keeps a [rows, BLOCK_N, BLOCK_K] float32 accumulator: batch 1 only.
FMA_MAX_ROWS = 1


@dataclasses.dataclass(frozen=True)
class Case:
    """One projection: ``weight [n, k]``; gated: ``n = 2I`` (gate rows, then up rows)."""

    name: str  # e.g. "llama-3.2-1b/qkv"
    n: int
    k: int
    gated: bool
    act: str
    # With --stages: the fused stages the model's block gives this projection (decode_stages), run
    # with weight_is_constant as a captured step runs it; None: the plain product.
    stages: FusedStages | None = None


def cases_of(models: dict[str, dict[str, Any]], with_stages: bool = False) -> list[Case]:
    """The projections of each model, one case per distinct (weight shape, gated)."""
    seen: dict[tuple[int, int, bool], Case] = {}
    for model, hf in models.items():
        c = ModelConfig.from_hf_dict(hf)
        shapes = decode_projections(c)
        stages = decode_stages(c)
        for proj, (n, k, gated) in shapes.items():
            if (n, k, gated) not in seen:
                staged = stages[proj] if with_stages else None
                seen[(n, k, gated)] = Case(f"{model}/{proj}", n, k, gated, c.hidden_act, staged)
    return list(seen.values())


@dataclasses.dataclass(frozen=True)
class StageInputs:
    """The tensors a case's stages read besides x and the weight (None where a stage is off)."""

    in_norm: NormSpec | None = None
    residual: torch.Tensor | None = None
    out_norm: NormSpec | None = None

    def kwargs(self) -> dict[str, Any]:
        return {"in_norm": self.in_norm, "residual": self.residual, "out_norm": self.out_norm}


def stage_inputs(case: Case, rows: int, gen: torch.Generator, device: torch.device, dtype: torch.dtype) -> StageInputs:
    """Norm weights as trained models have them (Gemma's near 0, else near 1), a residual N(0, 1)."""
    st = case.stages
    if st is None:
        return StageInputs()
    n_out = case.n // 2 if case.gated else case.n

    def norm(width: int) -> NormSpec:
        w = 0.2 * torch.randn(width, generator=gen, device=device) + (0.0 if st.unit_offset else 1.0)
        return NormSpec(w.to(dtype), 1e-6, st.unit_offset)

    return StageInputs(
        in_norm=norm(case.k) if st.in_norm else None,
        residual=torch.randn(rows, n_out, generator=gen, device=device).to(dtype) if st.residual else None,
        out_norm=norm(n_out) if st.out_norm else None,
    )


def candidates(case: Case, rows: int, profile: DeviceProfile) -> list[GemvConfig]:
    """Tiles x split_k in {1, half, the heuristic's, double} (distinct launched splits only), plus the
    default, on the device ``profile`` describes."""
    n_out = case.n // 2 if case.gated else case.n
    found = [default_config(n_out, case.k, rows, device=profile)]
    tiles = [t for t in TILES if t[4] != "fma" or rows <= FMA_MAX_ROWS]
    for block_n, block_k, warps, stages, path in tiles:
        blocks = math.ceil(n_out / block_n)
        wanted = max(1, math.ceil(target_programs(profile) / blocks))
        launched: set[int] = set()
        for split in sorted({1, max(1, wanted // 2), wanted, 2 * wanted}):
            splits = split_plan(case.k, block_k, split)[1]
            if splits in launched:
                continue
            launched.add(splits)
            found.append(GemvConfig(block_n, block_k, split, warps, stages, path))
    return list(dict.fromkeys(found))


def reference_of(case: Case, extra: StageInputs) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """What the kernel replaces: ``F.linear``, or the eager gated MLP (linear, activation, product),
    with the case's stages (eager torch ops) when it has them."""

    def gated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return gemv.gated_mlp_reference(x, w, case.act, in_norm=extra.in_norm)

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return gemv.linear_reference(x, w, **extra.kwargs())

    return gated if case.gated else linear


def kernel_of(case: Case, config: GemvConfig, extra: StageInputs) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The Triton kernel of ``case`` launched with ``config`` (and its stages, weights constant)."""
    constant = case.stages is not None

    def gated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return gemv.gated_mlp_triton(x, w, case.act, config=config, in_norm=extra.in_norm, weight_is_constant=constant)

    # The residual is an input no kernel of the timed graph writes: settled, as in a model's step.
    settled = constant and extra.residual is not None

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return gemv.linear_triton(
            x, w, config=config, weight_is_constant=constant, residual_is_settled=settled, **extra.kwargs()
        )

    return gated if case.gated else linear


def bytes_moved(case: Case, rows: int, itemsize: int) -> int:
    n_out = case.n // 2 if case.gated else case.n
    return (case.n * case.k + rows * case.k + rows * n_out) * itemsize


def run_case(
    case: Case,
    rows: int,
    configs: list[GemvConfig],
    args: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(hash((case.n, case.k, rows)) % 2**31)
    weight_bytes = case.n * case.k * dtype.itemsize
    copies = copies_for(weight_bytes, device)
    # Weights N(0, 1/K), inputs N(0, 1): outputs of order 1, as in a model.
    ws = [
        torch.randn(case.n, case.k, generator=gen, device=device, dtype=dtype) * case.k**-0.5
        for _ in range(copies)
    ]
    xs = [torch.randn(rows, case.k, generator=gen, device=device, dtype=dtype) for _ in range(copies)]
    extra = stage_inputs(case, rows, gen, device, dtype)
    if case.gated:
        want, bound = gated_oracle(xs[0], ws[0], case.act, in_norm=extra.in_norm)
    else:
        want, bound = linear_oracle(xs[0], ws[0], **extra.kwargs())
    moved = bytes_moved(case, rows, dtype.itemsize)
    on_gpu = device.type == "cuda" and gemv.HAVE_TRITON
    interpreted = device.type == "cpu" and gemv.HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"

    def timed(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        def one_round() -> None:
            for i in range(CALLS_PER_GRAPH):
                fn(xs[i % copies], ws[i % copies])

        if device.type == "cuda":
            replay = graph_of(one_round, device)
            return time_call(replay, device, iters=1, repeats=args.repeats) / CALLS_PER_GRAPH
        return time_call(lambda: fn(xs[0], ws[0]), device, iters=1, repeats=args.repeats)

    def entry(seconds: float) -> dict[str, Any]:
        gbps = moved / seconds / 1e9
        return {"us": seconds * 1e6, "GBps": gbps, "pct_copy": 100 * gbps / args.copy_gbps}

    reference = reference_of(case, extra)
    stages = dataclasses.asdict(case.stages) if case.stages is not None else None
    result: dict[str, Any] = {"case": case.name, "n": case.n, "k": case.k, "rows": rows, "gated": case.gated,
                              "stages": stages, "copies": copies, "bytes": moved, "cublas": entry(timed(reference)),
                              "configs": []}  # fmt: skip
    if case.gated:  # the GEMV alone, for the bandwidth cuBLAS reaches on this shape
        result["cublas_linear_only"] = entry(timed(gemv.linear_reference))
    for config in configs:
        # A CPU dry run without the interpreter: the loop, checks and report, the reference standing in.
        kernel = kernel_of(case, config, extra) if on_gpu or interpreted else reference
        row: dict[str, Any] = {
            "config": dataclasses.asdict(config),
            "splits": split_plan(case.k, config.block_k, config.split_k)[1],
        }
        try:
            problem = violations(kernel(xs[0], ws[0]), want, bound)
        except Exception as exc:  # a config the compiler or the device refuses (e.g. out of shared memory)
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            row.update(entry(timed(kernel)))
        else:
            row["error"] = problem[:300]
        result["configs"].append(row)
    timed_rows = [r for r in result["configs"] if "us" in r]
    result["best"] = min(timed_rows, key=lambda r: r["us"]) if timed_rows else None
    return result


def print_case(r: dict[str, Any]) -> None:
    cb = r["cublas"]
    print(f"\n{r['case']} weight [{r['n']}, {r['k']}] rows {r['rows']} ({r['copies']} copies): "
          f"cublas {cb['us']:.2f} us {cb['GBps']:.0f} GB/s {cb['pct_copy']:.0f}%")  # fmt: skip
    if "cublas_linear_only" in r:
        lo = r["cublas_linear_only"]
        print(f"  (cublas above: the eager gated MLP, F.linear + activation + product; "
              f"F.linear alone {lo['us']:.2f} us {lo['GBps']:.0f} GB/s {lo['pct_copy']:.0f}%)")  # fmt: skip
    for c in sorted(r["configs"], key=lambda c: c.get("us", math.inf)):
        cfg = c["config"]
        knobs = f"bn {cfg['block_n']:3d} bk {cfg['block_k']:3d} splits {c['splits']:2d} w {cfg['num_warps']} s {cfg['num_stages']} {cfg['path']:5s}"
        if "us" in c:
            print(
                f"  {knobs}: {c['us']:8.2f} us {c['GBps']:6.0f} GB/s {c['pct_copy']:4.0f}%  x{cb['us'] / c['us']:.2f}"
            )
        else:
            print(f"  {knobs}: FAILED {c['error']}")


def step_summary(
    models: dict[str, dict[str, Any]], results: list[dict[str, Any]], rows: int
) -> list[dict[str, Any]]:
    """Per model: the projections of one decode step (every layer's qkv, o, gate_up, down, then the
    LM head), their summed time with cuBLAS and with each shape's best config, and the bandwidth
    that makes. The rest of the step (attention, norms, RoPE) is not counted."""
    by_shape = {(r["n"], r["k"], r["gated"]): r for r in results if r["rows"] == rows}
    summary = []
    for model, hf in models.items():
        config = ModelConfig.from_hf_dict(hf)
        moved = cublas_s = best_s = 0.0
        complete = True
        for proj, (n, k, gated) in decode_projections(config).items():
            r = by_shape.get((n, k, gated))
            if r is None or r["best"] is None:
                complete = False
                continue
            times = 1 if proj == "lm_head" else config.num_hidden_layers
            moved += times * r["bytes"]
            cublas_s += times * r["cublas"]["us"] * 1e-6
            best_s += times * r["best"]["us"] * 1e-6
        if complete:
            summary.append({"model": model, "rows": rows, "bytes": moved, "cublas_us": cublas_s * 1e6, "best_us": best_s * 1e6,
                            "cublas_GBps": moved / cublas_s / 1e9, "best_GBps": moved / best_s / 1e9})  # fmt: skip
    return summary


def table_literal(results: list[dict[str, Any]]) -> str:
    """The best batch-1 config per weight shape, as Python source for the two tables of
    infer_ref/fast/kernels/gemv/tuning.py (the entries of the device's capability)."""
    lines = []
    for gated, table in ((False, "LINEAR_CONFIGS"), (True, "GATED_CONFIGS")):
        lines.append(f"{table}: dict[tuple[tuple[int, int], tuple[int, int]], GemvConfig] = {{")
        for r in results:
            if r["rows"] != 1 or r["best"] is None or r["gated"] != gated:
                continue
            cfg = GemvConfig(**r["best"]["config"])
            lines.append(
                f"    (CAPABILITY, ({r['n']}, {r['k']})): {cfg!r},  # {r['case']}: {r['best']['pct_copy']:.0f}% of copy, "
                f"cuBLAS {r['cublas']['pct_copy']:.0f}%"
            )
        lines.append("}")
    return "\n".join(lines)


# -- the per-layer chain of fused projections ---------------------------------------------------------

CHAIN_VARIANTS = ("fused", "fused_constant", "unfused", "compiled_before", "compiled_after")


@dataclasses.dataclass
class LayerWeights:
    """One layer's projections and norms (Gemma: the sandwich's four norms; else two)."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    attn_in: NormSpec
    mlp_in: NormSpec
    attn_out: NormSpec | None
    mlp_out: NormSpec | None


def make_layers(
    config: ModelConfig, copies: int, device: torch.device, dtype: torch.dtype
) -> list[LayerWeights]:
    """``copies`` layers of random weights (N(0, 1/K)) and norm weights as trained models have them."""
    shapes = decode_projections(config)
    gemma = config.model_type == "gemma3_text"
    e = config.hidden_size
    gen = torch.Generator(device=device).manual_seed(0)

    def weight(proj: str) -> torch.Tensor:
        n, k, _ = shapes[proj]
        return (torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k**-0.5).to(dtype)

    def norm() -> NormSpec:
        w = torch.randn(e, generator=gen, device=device, dtype=torch.float32)
        w = 0.5 * w if gemma else 1.0 + 0.3 * w
        return NormSpec(w.to(dtype), config.rms_norm_eps, gemma)

    return [
        LayerWeights(
            weight("qkv"),
            weight("o"),
            weight("gate_up"),
            weight("down"),
            norm(),
            norm(),
            norm() if gemma else None,
            norm() if gemma else None,
        )
        for _ in range(copies)
    ]


def layer_fn(
    variant: str, config: ModelConfig, use_kernels: bool
) -> Callable[[torch.Tensor, LayerWeights], torch.Tensor]:
    """One layer's projections ``x [1, 1, E] -> x``: o reads the q columns of qkv's output (where
    attention would sit). ``use_kernels``: the Triton entry points (else the references, on a CPU)."""
    q_dim, act = config.num_attention_heads * config.computed_head_dim, config.hidden_act
    lin = gemv.linear_triton if use_kernels else None
    gat = gemv.gated_mlp_triton if use_kernels else None

    def fused(x: torch.Tensor, p: LayerWeights, constant: bool) -> torch.Tensor:
        if lin is None or gat is None:
            qkv = gemv.linear_reference(x, p.qkv, in_norm=p.attn_in)
            x = gemv.linear_reference(qkv[..., :q_dim], p.o, residual=x, out_norm=p.attn_out)
            mid = gemv.gated_mlp_reference(x, p.gate_up, act, in_norm=p.mlp_in)
            return gemv.linear_reference(mid, p.down, residual=x, out_norm=p.mlp_out)
        # The residual stream is settled (written before the kernel just before its consumer), as in
        # a model's step; the promises go together in this variant.
        qkv = lin(x, p.qkv, in_norm=p.attn_in, weight_is_constant=constant)
        x = lin(qkv[..., :q_dim], p.o, residual=x, out_norm=p.attn_out, weight_is_constant=constant, residual_is_settled=constant)
        mid = gat(x, p.gate_up, act, in_norm=p.mlp_in, weight_is_constant=constant)
        return lin(mid, p.down, residual=x, out_norm=p.mlp_out, weight_is_constant=constant, residual_is_settled=constant)

    def unfused(x: torch.Tensor, p: LayerWeights) -> torch.Tensor:
        plain = lin if lin is not None else gemv.linear_reference
        gated = gat if gat is not None else gemv.gated_mlp_reference
        qkv = plain(p.attn_in(x), p.qkv)
        y = plain(qkv[..., :q_dim], p.o)
        x = x + (y if p.attn_out is None else p.attn_out(y))
        y = plain(gated(p.mlp_in(x), p.gate_up, act), p.down)
        return x + (y if p.mlp_out is None else p.mlp_out(y))

    def before(x: torch.Tensor, p: LayerWeights) -> torch.Tensor:  # the dispatching calls, no stages
        qkv = gemv.linear(p.attn_in(x), p.qkv)
        y = gemv.linear(qkv[..., :q_dim], p.o)
        x = x + (y if p.attn_out is None else p.attn_out(y))
        y = gemv.linear(gemv.gated_mlp(p.mlp_in(x), p.gate_up, act), p.down)
        return x + (y if p.mlp_out is None else p.mlp_out(y))

    def after(x: torch.Tensor, p: LayerWeights) -> torch.Tensor:  # the dispatching calls, with stages
        qkv = gemv.linear(x, p.qkv, in_norm=p.attn_in, weight_is_constant=True)
        x = gemv.linear(qkv[..., :q_dim], p.o, residual=x, out_norm=p.attn_out, weight_is_constant=True, residual_is_settled=True)
        mid = gemv.gated_mlp(x, p.gate_up, act, in_norm=p.mlp_in, weight_is_constant=True)
        return gemv.linear(mid, p.down, residual=x, out_norm=p.mlp_out, weight_is_constant=True, residual_is_settled=True)

    variants: dict[str, Callable[[torch.Tensor, LayerWeights], torch.Tensor]] = {
        "fused": lambda x, p: fused(x, p, False),
        "fused_constant": lambda x, p: fused(x, p, True),
        "unfused": unfused,
    }
    if variant.startswith("compiled"):  # compiled lazily, on the first call
        return torch.compile(before if variant == "compiled_before" else after, dynamic=False)
    return variants[variant]


def _reference_layer(x: torch.Tensor, p: LayerWeights, q_dim: int, act: str) -> torch.Tensor:
    """The layer's definition in eager torch ops (the models' own)."""
    qkv = gemv.linear_reference(x, p.qkv, in_norm=p.attn_in)
    x = gemv.linear_reference(qkv[..., :q_dim], p.o, residual=x, out_norm=p.attn_out)
    mid = gemv.gated_mlp_reference(x, p.gate_up, act, in_norm=p.mlp_in)
    return gemv.linear_reference(mid, p.down, residual=x, out_norm=p.mlp_out)


def run_chain(
    model: str, hf: dict[str, Any], args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Per-layer times of each chain variant for one family, and each projection alone with and
    without its stages."""
    config = ModelConfig.from_hf_dict(hf)
    shapes = decode_projections(config)
    layer_bytes = sum(n * k for proj, (n, k, _) in shapes.items() if proj != "lm_head") * dtype.itemsize
    copies = copies_for(layer_bytes, device)
    layers = make_layers(config, copies, device, dtype)
    depth = config.num_hidden_layers
    on_gpu = device.type == "cuda" and gemv.HAVE_TRITON
    use_kernels = on_gpu or (gemv.HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1")
    e = config.hidden_size
    x0 = torch.randn(1, 1, e, generator=torch.Generator(device=device).manual_seed(1), device=device).to(
        dtype
    )
    want = _reference_layer(
        x0, layers[0], config.num_attention_heads * config.computed_head_dim, config.hidden_act
    )
    result: dict[str, Any] = {"model": model, "layers": depth, "copies": copies, "layer_weight_bytes": layer_bytes,
                              "variants": {}, "projections": {}}  # fmt: skip
    for variant in args.variants:
        if variant.startswith("compiled") and not on_gpu:
            result["variants"][variant] = {"skipped": "torch.compile variants run on a GPU only"}
            continue
        try:
            fn = layer_fn(variant, config, use_kernels)
            with decode_kernels(variant.startswith("compiled")):
                got = fn(x0, layers[0])
                rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
                x = x0.clone()

                def one_round(
                    fn: Callable[[torch.Tensor, LayerWeights], torch.Tensor] = fn, x: torch.Tensor = x
                ) -> None:
                    h = x
                    for i in range(depth):
                        h = fn(h, layers[i % copies])

                if device.type == "cuda":
                    seconds = time_call(graph_of(one_round, device), device, iters=1, repeats=args.repeats)
                else:
                    seconds = time_call(one_round, device, iters=1, repeats=args.repeats)
            result["variants"][variant] = {"us_per_layer": seconds / depth * 1e6, "us_per_step": seconds * 1e6,
                                           "GBps": layer_bytes * depth / seconds / 1e9, "rel_err_vs_reference": rel}  # fmt: skip
        except Exception as exc:  # a variant the compiler or the device refuses: reported, not fatal
            result["variants"][variant] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    stages = decode_stages(config)
    for proj in ("qkv", "o", "gate_up", "down"):
        result["projections"][proj] = time_projection(
            config, proj, stages[proj], layers, args, device, dtype, use_kernels
        )
    return result


def time_projection(
    config: ModelConfig,
    proj: str,
    st: FusedStages,
    layers: list[LayerWeights],
    args: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
    use_kernels: bool,
) -> dict[str, Any]:
    """One projection alone (its table config, rotating weight copies, graph-replayed): ``plain``,
    ``staged`` (the stages its block folds in) and ``staged_constant`` (also weight_is_constant)."""
    n, k, gated = decode_projections(config)[proj]
    copies = len(layers)
    ws = [getattr(p, proj) for p in layers]
    gen = torch.Generator(device=device).manual_seed(n + k)
    xs = [torch.randn(1, k, generator=gen, device=device).to(dtype) for _ in range(copies)]
    norm_w = torch.randn(max(n, k), generator=gen, device=device).to(dtype)
    stage_args: dict[str, Any] = {
        "in_norm": NormSpec(norm_w[:k], config.rms_norm_eps, st.unit_offset) if st.in_norm else None
    }
    if not gated:
        stage_args["residual"] = (
            torch.randn(1, n, generator=gen, device=device).to(dtype) if st.residual else None
        )
        stage_args["out_norm"] = (
            NormSpec(norm_w[:n], config.rms_norm_eps, st.unit_offset) if st.out_norm else None
        )
    row: dict[str, Any] = {"n": n, "k": k, "gated": gated, "stages": dataclasses.asdict(st)}
    for kind, staged, extra in (
        ("plain", {}, {}),
        ("staged", stage_args, {}),
        ("staged_constant", stage_args, {"weight_is_constant": True}),
    ):
        call = _projection_call(config, gated, xs, ws, staged, extra, use_kernels)

        def one_round(call: Callable[[int], torch.Tensor] = call) -> None:
            for i in range(CALLS_PER_GRAPH):
                call(i % copies)

        try:
            if device.type == "cuda":
                seconds = time_call(graph_of(one_round, device), device, iters=1, repeats=args.repeats)
            else:
                seconds = time_call(one_round, device, iters=1, repeats=args.repeats)
            row[kind] = {"us": seconds / CALLS_PER_GRAPH * 1e6}
        except Exception as exc:  # reported, not fatal
            row[kind] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return row


def _projection_call(
    config: ModelConfig,
    gated: bool,
    xs: list[torch.Tensor],
    ws: list[torch.Tensor],
    staged: dict[str, Any],
    extra: dict[str, Any],
    use_kernels: bool,
) -> Callable[[int], torch.Tensor]:
    """Call ``i``: the kernel (or, on a CPU without the interpreter, the reference) on copy ``i``."""

    def call(i: int) -> torch.Tensor:
        if gated and use_kernels:
            return gemv.gated_mlp_triton(xs[i], ws[i], config.hidden_act, **staged, **extra)
        if gated:
            return gemv.gated_mlp_reference(xs[i], ws[i], config.hidden_act, **staged)
        if use_kernels:
            # With the weights constant, the residual is settled too: as a model's step calls it.
            settled = bool(extra.get("weight_is_constant")) and staged.get("residual") is not None
            return gemv.linear_triton(xs[i], ws[i], **staged, **extra, residual_is_settled=settled)
        return gemv.linear_reference(xs[i], ws[i], **staged)

    return call


def print_chain(r: dict[str, Any]) -> None:
    print(f"\n{r['model']}: {r['layers']} layers, {r['layer_weight_bytes'] / 2**20:.0f} MiB of projection weights "
          f"per layer ({r['copies']} distinct copies)")  # fmt: skip
    print(f"  {'variant':16s} {'us/layer':>9s} {'us/step':>9s} {'GB/s':>7s} {'rel.err':>9s}")
    for variant, v in r["variants"].items():
        if "us_per_layer" in v:
            print(
                f"  {variant:16s} {v['us_per_layer']:9.2f} {v['us_per_step']:9.1f} {v['GBps']:7.0f} {v['rel_err_vs_reference']:9.2e}"
            )
        else:
            print(f"  {variant:16s} {v.get('skipped') or 'FAILED ' + v['error']}")
    print(
        f"  {'projection':10s} {'stages':28s} {'plain us':>9s} {'staged us':>9s} {'+const us':>9s} {'stage cost':>10s}"
    )
    for proj, row in r["projections"].items():
        st = row["stages"]
        names = "+".join(k for k in ("in_norm", "out_norm", "residual") if st[k]) or "-"
        times = [row[k].get("us", math.nan) for k in ("plain", "staged", "staged_constant")]
        print(
            f"  {proj:10s} {names:28s} {times[0]:9.2f} {times[1]:9.2f} {times[2]:9.2f} {times[1] - times[0]:+10.2f}"
        )


def main_chain(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    models = {f"tiny-{k}": v for k, v in TINY_CONFIGS.items()} if args.dry_run else dict(REAL_SHAPE_CONFIGS)
    results = []
    with torch.inference_mode():
        for model, hf in models.items():
            r = run_chain(model, hf, args, device, dtype)
            print_chain(r)
            results.append(r)
    return {"mode": "chain", "variants": list(args.variants), "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=5, help="timed graph replays per config (median)")
    p.add_argument(
        "--dry-run", action="store_true", help="tiny shapes, 2 configs per case (checks the script runs)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=210.0,
        help="past this many seconds, the remaining cases time only the picked and the heuristic config",
    )
    p.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    p.add_argument(
        "--stages", action="store_true",
        help="sweep each projection with the fused stages its block gives it (in_norm, residual, out_norm), "
        "weights constant: the calls a captured decode step makes (cuBLAS then times the eager ops they replace)",
    )  # fmt: skip
    p.add_argument(
        "--mode", choices=["sweep", "chain"], default="sweep",
        help="sweep: launch configs per projection against cuBLAS; chain: a layer's fused projections",
    )  # fmt: skip
    p.add_argument(
        "--variants",
        nargs="+",
        choices=CHAIN_VARIANTS,
        default=list(CHAIN_VARIANTS),
        help="chain variants to time",
    )
    args = p.parse_args(argv)
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    for rows in args.rows:
        if not 1 <= rows <= gemv.MAX_ROWS:
            p.error(f"--rows: each must be in 1..{gemv.MAX_ROWS}, got {rows}")
    if device.type == "cuda" and not gemv.HAVE_TRITON:
        p.error("Triton is not importable: the kernels cannot run (install triton)")
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    started = time.perf_counter()
    copy = d2d_copy_bandwidth(device, mib=8 if args.dry_run else 1024)
    args.copy_gbps = copy["best_GBps"]
    print(f"device-to-device copy: {args.copy_gbps:.0f} GB/s (best), {copy['median_GBps']:.0f} GB/s (median)")
    if args.mode == "chain":
        report = {
            "benchmark": "gemv_chain", "dtype": args.dtype, "copy": copy, "environment": environment(device),
            "pdl": os.environ.get("INFER_REF_PDL", "1") != "0",
            "timing": {"repeats": args.repeats, "clock": "cuda events, graph replay" if device.type == "cuda" else "perf_counter"},
            **main_chain(args, device, dtype), "elapsed_s": time.perf_counter() - started,
        }  # fmt: skip
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {args.json}")
        return 0
    models = {f"tiny-{k}": v for k, v in TINY_CONFIGS.items()} if args.dry_run else dict(REAL_SHAPE_CONFIGS)
    profile = device_profile(device)  # the device the heuristic's candidates fill
    results = []
    with torch.inference_mode():
        for rows in args.rows:  # batch 1 first: it picks the table entries
            for case in cases_of(models, args.stages):
                configs = candidates(case, rows, profile)[: 2 if args.dry_run else None]
                if time.perf_counter() - started > args.budget_s:  # out of time: what dispatch picks only
                    configs = list(
                        dict.fromkeys([gemv.gemv_config(case.n, case.k, rows, gated=case.gated, device=profile), configs[0]])
                    )
                r = run_case(case, rows, configs, args, device, dtype)
                print_case(r)
                results.append(r)
    summary = [row for rows in args.rows for row in step_summary(models, results, rows)]
    print("\n# projections of one decode step (all layers + LM head), graph-replayed times summed:")
    for row in summary:
        print(f"{row['model']} rows {row['rows']}: cuBLAS {row['cublas_us']:.0f} us ({row['cublas_GBps']:.0f} GB/s, "
              f"{100 * row['cublas_GBps'] / args.copy_gbps:.0f}% of copy), best configs {row['best_us']:.0f} us "
              f"({row['best_GBps']:.0f} GB/s, {100 * row['best_GBps'] / args.copy_gbps:.0f}% of copy)")  # fmt: skip
    literal = table_literal(results)
    print("\n# best batch-1 config per weight shape (paste into infer_ref/fast/kernels/gemv/tuning.py):\n" + literal)
    elapsed = time.perf_counter() - started
    print(f"\n{len(results)} cases in {elapsed:.0f} s")
    report = {
        "benchmark": "gemv",
        "dtype": args.dtype,
        "kernel": "triton" if device.type == "cuda" else ("interpreter" if os.environ.get("TRITON_INTERPRET") == "1" and gemv.HAVE_TRITON else "reference"),
        "timing": {"calls_per_graph": CALLS_PER_GRAPH, "repeats": args.repeats, "budget_s": args.budget_s, "clock": "cuda events, graph replay" if device.type == "cuda" else "perf_counter"},
        "copy": copy,
        "environment": environment(device),
        "elapsed_s": elapsed,
        "table": literal,
        "step_summary": summary,
        "results": results,
    }  # fmt: skip
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
