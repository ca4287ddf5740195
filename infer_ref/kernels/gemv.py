"""Matrix-vector products for the decode step: a linear layer and the gated MLP's first half.

A decode step multiplies a handful of rows (batch x tokens, usually 1) by each weight matrix, so
it is bound by reading the weights: the work is a GEMV, and cuBLAS reaches well under the copy
bandwidth on the small projections of a 1B model. These kernels read each weight once with enough
programs in flight to saturate HBM.

The definitions:

- :func:`linear_reference` ``(x, weight, bias)`` is ``F.linear``;
- :func:`gated_mlp_reference` ``(x, weight, act)``: ``weight`` ``[2I, K]`` stacks the gate rows then
  the up rows, and the result is ``act(g) * u`` with ``g, u = F.linear(x, weight).split(I, -1)``.

The Triton kernel computes ``x [M, K] @ weight[N, K]^T`` in float32 for ``M <= MAX_ROWS`` rows. A
program owns ``BLOCK_N`` output columns and one of ``SPLIT_K`` slices of K; it walks its slice in
``BLOCK_K`` tiles along one of three paths: ``"dot"``, ``tl.dot(x, W^T)`` with the rows padded to
16 (the weight tile pipelined through shared memory over ``num_stages``); ``"dot_t"``, the same
product transposed, ``tl.dot(W, x^T)``, so the weight block is the MMA's M side (the "swap AB" of
small-batch GEMMs: tensor cores prefer many rows there); ``"fma"``, a multiply-and-add into a
``[M, BLOCK_N, BLOCK_K]`` float32 accumulator reduced once at the end (the classic GEMV form). When
K and N divide into whole tiles and blocks, weight loads carry no masks.With one
split the program finishes the output itself; with several, each writes float32 partials
``[SPLIT_K, M, N]`` and a second kernel sums them in split order (deterministic: no atomics) and
finishes. Finishing means: add the bias, round to x's dtype; for the gated variant, where a program
owns gate rows ``j`` and up rows ``I + j`` together, round ``g`` and ``u`` to the dtype, compute the
activation in float32 from the rounded ``g`` and round it, multiply the two rounded values in
float32 and round — the roundings eager torch does in bf16, so the kernel differs from the
reference only by the order of the dot products' sums.

:func:`linear` and :func:`gated_mlp` dispatch: the kernel when ``x`` is on CUDA, Triton is
importable, the dtype is bf16/fp16/fp32, the rows fit (``1..MAX_ROWS``), the weight is contiguous
and the decode kernels are switched on (:mod:`infer_ref.kernels.switch`); the reference otherwise.
Checks are host-side metadata only and buffers are sized by shapes alone, so a call can be
captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.config import ModelConfig
from infer_ref.kernels.pdl import pdl_options
from infer_ref.kernels.switch import decode_kernels_enabled
from infer_ref.memory import overlap

try:  # Triton is optional: absent on CPU-only installs, where the reference serves every call.
    import triton
    import triton.language as tl

    from infer_ref.kernels.pdl import pdl_prologue

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
# The kernels' activation codes (a Triton constexpr), one per name of ACTIVATIONS.
_ACT_CODES = {"silu": 0, "gelu_pytorch_tanh": 1}

# Rows (batch x tokens) the kernels take. Decode is 1 row per sequence; 8 covers small batches and
# short speculative verify steps. The dot paths pad rows to 16 anyway (the smallest tl.dot tile),
# so the bound is set by the multiply-and-add path's [rows, BLOCK_N, BLOCK_K] accumulator, whose
# registers grow with the padded row count.
MAX_ROWS = 8
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Programs the default configuration aims for: about four per SM of an H100 (132 SMs), enough to
# keep the memory system busy while some programs wait on their loads.
TARGET_PROGRAMS = 4 * 132


# -- references ----------------------------------------------------------------------------------


def linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The definition: ``F.linear(x, weight, bias)``, ``x [..., K]``, ``weight [N, K]`` -> ``[..., N]``."""
    return F.linear(x, weight, bias)


def gated_mlp_reference(x: Tensor, weight: Tensor, act: str) -> Tensor:
    """The definition: ``act(g) * u`` where ``g, u = F.linear(x, weight).split(I, -1)``.

    ``weight`` is ``[2I, K]``: gate rows ``0..I-1`` then up rows ``I..2I-1``; the result is ``[..., I]``.
    """
    check_gated_args(x, weight, act)
    return _gated_product(x, weight, act)


def _gated_product(x: Tensor, weight: Tensor, act: str) -> Tensor:
    g, u = F.linear(x, weight).split(weight.shape[0] // 2, dim=-1)  # [..., I] each
    return ACTIVATIONS[act](g) * u


# -- launch configuration ------------------------------------------------------------------------


PATHS = ("dot", "dot_t", "fma")  # see the module docstring; the kernel's PATH is the index


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Launch knobs of one kernel call.

    ``block_n`` output columns per program (per half for the gated kernel), ``block_k`` the K tile,
    ``split_k`` the K slices (at most; slices are whole tiles, so fewer may be launched),
    ``num_warps``/``num_stages`` as Triton takes them, ``path`` one of :data:`PATHS`.
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    path: str = "dot"

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        # tl.dot's smallest tile is 16 on each side; the multiply-and-add path takes any block.
        smallest = {"block_n": 1 if self.path == "fma" else 16, "block_k": 16}
        for name, low in smallest.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low or value & (value - 1):
                raise ValueError(
                    f"{name} must be a power of two >= {low} on the {self.path!r} path, got {value!r}"
                )
        for name in ("split_k", "num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16) or isinstance(self.num_warps, bool):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")


# Launch configs per weight shape (N, K): the batch-1 winners of benchmarks/bench_gemv.py's sweep
# on an H100 with programmatic dependent launch (benchmarks/log/h100_gemv.json; the comments give %
# of copy bandwidth, kernel vs cuBLAS). The gated kernel's table is keyed by the stacked [2I, K].
# Batch 1 only: the multiply-and-add path keeps a [rows, BLOCK_N, BLOCK_K] float32 accumulator, so
# with more rows gemv_config takes the heuristic's tl.dot config instead (see gemv_config).
LINEAR_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (3072, 2048): GemvConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"),  # llama qkv: 68 vs 57
    (2048, 2048): GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"),  # llama/qwen3 o: 58 vs 44
    (2048, 8192): GemvConfig(block_n=8, block_k=512, split_k=3, num_warps=4, num_stages=3, path="fma"),  # llama down: 81 vs 69
    (128256, 2048): GemvConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"),  # llama lm_head: 105 vs 94
    (4096, 2048): GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"),  # qwen3 qkv: 75 vs 64
    (2048, 6144): GemvConfig(block_n=8, block_k=512, split_k=3, num_warps=4, num_stages=3, path="fma"),  # qwen3 down: 77 vs 63
    (151936, 2048): GemvConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"),  # qwen3 lm_head: 105 vs 96
    (1536, 1152): GemvConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"),  # gemma qkv: 34 vs 24
    (1152, 1024): GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"),  # gemma o: 33 vs 18
    (1152, 6912): GemvConfig(block_n=8, block_k=512, split_k=4, num_warps=4, num_stages=3, path="fma"),  # gemma down: 67 vs 49
    (262144, 1152): GemvConfig(block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"),  # gemma lm_head: 105 vs 95
}
GATED_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (16384, 2048): GemvConfig(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4, path="dot_t"),  # llama gate_up: 93 vs 78
    (12288, 2048): GemvConfig(block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"),  # qwen3 gate_up: 92 vs 73
    (13824, 1152): GemvConfig(block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"),  # gemma gate_up: 86 vs 62
}
# Shapes that keep F.linear even with the decode kernels on. Under torch.compile, Inductor fuses
# the input RMSNorm into its own reduction for the qkv product (H100, Llama's: 5.8-6.4 us, norm
# included), which the kernel alone (6.2 us) does not beat once the norm needs a kernel of its own.
# Qwen3's qkv has the same structure and stays with it too (not measured on its own).
CUBLAS_SHAPES: frozenset[tuple[int, int]] = frozenset({(3072, 2048), (4096, 2048)})
# Rows up to which a table config applies (the sweep's batch-1 winners).
TABLE_ROWS = 1


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


def default_config(n_out: int, k: int, rows: int) -> GemvConfig:
    """The heuristic for shapes the table lacks.

    Columns: 64 per program when that alone gives TARGET_PROGRAMS programs (the LM head), else 32,
    so that small matrices still spread over many programs. K: tiles of 128 through tl.dot with 4
    stages in flight. When the column blocks alone are too few (qkv, o and down of a 1B model have
    48-96), split K until about TARGET_PROGRAMS programs run, but keep at least two tiles per split:
    a shorter split spends more on its partials and its pipeline's ramp than it saves.
    """
    block_n = 64 if math.ceil(n_out / 64) >= TARGET_PROGRAMS else 32
    block_k = 128
    column_blocks = math.ceil(n_out / block_n)
    split_k = max(1, min(math.ceil(TARGET_PROGRAMS / column_blocks), k // (2 * block_k)))
    return GemvConfig(
        block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=4, path="dot"
    )


def gemv_config(n: int, k: int, rows: int, *, gated: bool = False) -> GemvConfig:
    """The launch configuration for a weight ``[n, k]`` and ``rows`` rows: the table's (up to
    ``TABLE_ROWS`` rows), else the heuristic's.

    ``gated``: the weight stacks gate and up rows, so a program's columns are ``n // 2`` wide.
    """
    found = (GATED_CONFIGS if gated else LINEAR_CONFIGS).get((n, k))
    if found is not None and rows <= TABLE_ROWS:
        return found
    return default_config(n // 2 if gated else n, k, rows)


def split_plan(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(k_per_split, splits)``: K cut into at most ``split_k`` slices of whole ``block_k`` tiles.

    Every launched slice is non-empty: a request for more slices than tiles launches one per tile.
    """
    tiles = max(1, math.ceil(k / block_k))
    k_per_split = math.ceil(tiles / min(split_k, tiles)) * block_k
    return k_per_split, max(1, math.ceil(k / k_per_split))


# -- host checks ---------------------------------------------------------------------------------


def _check_common(x: Tensor, weight: Tensor, what: str) -> None:
    if not isinstance(x, Tensor) or not isinstance(weight, Tensor):
        raise TypeError(
            f"{what}: x and weight must be tensors, got {type(x).__name__} and {type(weight).__name__}"
        )
    if weight.dim() != 2:
        raise ValueError(f"{what}: weight must be [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{what}: x must be [..., K={weight.shape[1]}] to match weight {tuple(weight.shape)}, got {tuple(x.shape)}"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"{what}: x must be a floating-point tensor, got {x.dtype}")
    if weight.dtype != x.dtype:
        raise TypeError(
            f"{what}: weight has dtype {weight.dtype}, x has {x.dtype}: the product never converts"
        )
    if weight.device != x.device:
        raise ValueError(f"{what}: weight is on {weight.device}, x is on {x.device}")


def _check_out(out: Tensor | None, x: Tensor, weight: Tensor, n_out: int, what: str) -> None:
    if out is None:
        return
    want = (*x.shape[:-1], n_out)
    if not isinstance(out, Tensor):
        raise TypeError(f"{what}: out must be a tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != want:
        raise ValueError(
            f"{what}: out must be {want} (x's leading dims, then the output width), got {tuple(out.shape)}"
        )
    if out.dtype != x.dtype:
        raise TypeError(f"{what}: out has dtype {out.dtype}, x has {x.dtype}")
    if out.device != x.device:
        raise ValueError(f"{what}: out is on {out.device}, x is on {x.device}")
    if not out.is_contiguous():
        raise ValueError(
            f"{what}: out must be contiguous, got strides {out.stride()} for shape {tuple(out.shape)}"
        )
    for name, t in (("x", x), ("weight", weight)):
        if overlap(out, t):
            raise ValueError(f"{what}: out shares memory with {name}: the kernel would read what it writes")


def check_linear_args(x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor | None = None) -> None:
    """Shapes, dtypes and devices of a linear call (host metadata only: no device synchronisation)."""
    _check_common(x, weight, "linear")
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"linear: bias must be a tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"linear: bias must be [N={weight.shape[0]}], got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"linear: bias has dtype {bias.dtype}, x has {x.dtype}")
        if bias.device != x.device:
            raise ValueError(f"linear: bias is on {bias.device}, x is on {x.device}")
    _check_out(out, x, weight, weight.shape[0], "linear")


def check_gated_args(x: Tensor, weight: Tensor, act: str, out: Tensor | None = None) -> None:
    """Shapes, dtypes, devices and the activation name of a gated-MLP call (host metadata only)."""
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"gated_mlp: unknown activation {act!r}: expected one of {sorted(ACTIVATIONS)}")
    _check_common(x, weight, "gated_mlp")
    if weight.shape[0] == 0 or weight.shape[0] % 2:
        raise ValueError(
            f"gated_mlp: weight must be [2I, K] (gate rows then up rows), got {weight.shape[0]} rows: not a positive even count"
        )
    _check_out(out, x, weight, weight.shape[0] // 2, "gated_mlp")


def _check_kernel_args(x: Tensor, weight: Tensor, config: GemvConfig | None, what: str) -> int:
    """What only the kernel needs; returns the row count."""
    rows = math.prod(x.shape[:-1])
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"{what}: the kernel takes 1..{MAX_ROWS} rows (x's leading dims), got {rows}")
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{what}: the kernel takes {[str(d) for d in KERNEL_DTYPES]}, got {x.dtype}")
    if not weight.is_contiguous():
        raise ValueError(
            f"{what}: the kernel needs a row-major contiguous weight [N, K], got strides {weight.stride()}"
        )
    if weight.shape[1] == 0:
        raise ValueError(f"{what}: the kernel needs K >= 1, got weight {tuple(weight.shape)}")
    if config is not None and not isinstance(config, GemvConfig):
        raise TypeError(f"{what}: config must be a GemvConfig or None, got {type(config).__name__}")
    return rows


def _kernel_eligible(x: Tensor, weight: Tensor) -> bool:
    rows = math.prod(x.shape[:-1])
    return (
        HAVE_TRITON
        and decode_kernels_enabled()
        and x.is_cuda
        and x.dtype in KERNEL_DTYPES
        and 1 <= rows <= MAX_ROWS
        and weight.is_contiguous()
        and weight.shape[1] > 0
    )


# -- kernels -------------------------------------------------------------------------------------

if HAVE_TRITON:

    @triton.jit
    def _finish(  # type: ignore[no-untyped-def]  # Triton reads the signature
        acc, acc_up, bias_ptr, offs_n, n_ok,
        OUT_DTYPE: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        # acc, acc_up [R, C] float32 sums -> [R, C] in OUT_DTYPE, rounding where eager torch rounds.
        if GATED:
            g = acc.to(OUT_DTYPE).to(tl.float32)
            u = acc_up.to(OUT_DTYPE).to(tl.float32)
            if ACT == 0:  # silu, as ATen writes it: x / (1 + exp(-x))
                a = g / (1.0 + tl.exp(-g))
            else:  # gelu tanh: 0.5 x (1 + tanh(y)), y = sqrt(2/pi) (x + 0.044715 x^3)
                # 0.5 (1 + tanh(y)) is sigmoid(2y): no cancellation where tanh(y) nears -1.
                inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
                a = g / (1.0 + tl.exp(-2.0 * inner))
            a = a.to(OUT_DTYPE).to(tl.float32)
            y = (a * u).to(OUT_DTYPE)
        else:
            if HAS_BIAS:
                acc = acc + tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            y = acc.to(OUT_DTYPE)
        return y

    @triton.jit
    def _load_tile(ptrs, row_ok, col_ok, ROWS_WHOLE: tl.constexpr, COLS_WHOLE: tl.constexpr):  # type: ignore[no-untyped-def]
        # A [R, C] tile; a side known to lie wholly in range needs no mask (plain vector loads).
        if ROWS_WHOLE and COLS_WHOLE:
            tile = tl.load(ptrs)
        elif ROWS_WHOLE:
            tile = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
        elif COLS_WHOLE:
            tile = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        return tile

    @triton.jit
    def _gemv_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr,
        rows, n_out, k, tiles_per_split, up_offset,  # up_offset: rows from gate row j to up row j (I)
        stride_xm, stride_xk, stride_om, stride_ps, stride_pm,  # x [M, K], out [M, n_out], parts [S, M, *]
        ROWS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PATH: tl.constexpr,
        EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, GATED: tl.constexpr,
        ACT: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_PARTIALS: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program (column block, K slice): columns [n0, n0 + BLOCK_N) of every row over one slice of K.
        pdl_prologue(USE_PDL)  # x is the previous kernel's output
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        n_ok = offs_n < n_out
        offs_m = tl.arange(0, ROWS_PAD)  # [ROWS_PAD]
        m_ok = offs_m < rows
        # Every slice walks the same tile count (a kernel argument, not derived from the program id:
        # a uniform trip count pipelines best) and ends where the next begins; tiles past K load nothing.
        k_start = split * tiles_per_split * BLOCK_K
        # Row pointers in int64: row * K overflows int32 for weights past 2**31 elements.
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k  # [BLOCK_N, 1]
        w_up_rows = w_ptr + (offs_n + up_offset).to(tl.int64)[:, None] * k  # read only if GATED
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [ROWS_PAD, 1]
        if PATH == 0:  # dot: [ROWS_PAD, BLOCK_N]
            acc = tl.zeros([ROWS_PAD, BLOCK_N], tl.float32)
            acc_up = tl.zeros([ROWS_PAD, BLOCK_N], tl.float32)
        elif PATH == 1:  # dot_t: the transpose, [BLOCK_N, ROWS_PAD]
            acc = tl.zeros([BLOCK_N, ROWS_PAD], tl.float32)
            acc_up = tl.zeros([BLOCK_N, ROWS_PAD], tl.float32)
        elif ROWS_PAD == 1:  # fma, one row: products accumulate per (column, k lane), reduced at the end
            acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
            acc2_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        else:  # fma: the same per (row, column, k lane)
            acc3 = tl.zeros([ROWS_PAD, BLOCK_N, BLOCK_K], tl.float32)
            acc3_up = tl.zeros([ROWS_PAD, BLOCK_N, BLOCK_K], tl.float32)
        for tile in range(0, tiles_per_split):
            offs_k = k_start + tile * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = offs_k < k
            xt = _load_tile(
                x_rows + offs_k[None, :] * stride_xk, m_ok, k_ok, False, EVEN_K
            )  # [ROWS_PAD, BLOCK_K]
            wt = _load_tile(w_rows + offs_k[None, :], n_ok, k_ok, EVEN_N, EVEN_K)  # [BLOCK_N, BLOCK_K]
            if GATED:
                wu = _load_tile(w_up_rows + offs_k[None, :], n_ok, k_ok, EVEN_N, EVEN_K)
            if PATH == 0:
                acc = tl.dot(xt, tl.trans(wt), acc, input_precision=DOT_PRECISION)
                if GATED:
                    acc_up = tl.dot(xt, tl.trans(wu), acc_up, input_precision=DOT_PRECISION)
            elif PATH == 1:
                acc = tl.dot(wt, tl.trans(xt), acc, input_precision=DOT_PRECISION)
                if GATED:
                    acc_up = tl.dot(wu, tl.trans(xt), acc_up, input_precision=DOT_PRECISION)
            elif ROWS_PAD == 1:
                x1 = xt.to(tl.float32)  # [1, BLOCK_K], broadcast over the columns
                acc2 += wt.to(tl.float32) * x1
                if GATED:
                    acc2_up += wu.to(tl.float32) * x1
            else:
                x3 = xt.to(tl.float32)[:, None, :]  # [ROWS_PAD, 1, BLOCK_K]
                acc3 += x3 * wt.to(tl.float32)[None, :, :]
                if GATED:
                    acc3_up += x3 * wu.to(tl.float32)[None, :, :]
        if PATH == 2 and ROWS_PAD == 1:
            acc = tl.sum(acc2, axis=1)[None, :]  # [1, BLOCK_N]
            acc_up = tl.sum(acc2_up, axis=1)[None, :]
        elif PATH == 2:
            acc = tl.sum(acc3, axis=2)  # [ROWS_PAD, BLOCK_N]
            acc_up = tl.sum(acc3_up, axis=2)
        elif PATH == 1:
            acc = tl.trans(acc)  # [ROWS_PAD, BLOCK_N]
            acc_up = tl.trans(acc_up)
        mask = m_ok[:, None] & n_ok[None, :]
        if WRITE_PARTIALS:
            part = part_ptr + split * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :]
            tl.store(part, acc, mask=mask)
            if GATED:
                tl.store(part + up_offset, acc_up, mask=mask)
        else:
            y = _finish(acc, acc_up, bias_ptr, offs_n, n_ok, out_ptr.dtype.element_ty, GATED, ACT, HAS_BIAS)
            tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y, mask=mask)

    @triton.jit
    def _combine_kernel(  # type: ignore[no-untyped-def]  # Triton reads the signature
        part_ptr, bias_ptr, out_ptr,
        splits, n_out, up_offset, stride_ps, stride_pm, stride_om,
        BLOCK: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):  # fmt: skip
        # Program (column block, row): sum the split partials in split order 0, 1, ... and finish.
        pdl_prologue(USE_PDL)
        pid = tl.program_id(0)
        row = tl.program_id(1)
        offs_n = pid * BLOCK + tl.arange(0, BLOCK)
        n_ok = offs_n < n_out
        base = part_ptr + row * stride_pm + offs_n[None, :]  # [1, BLOCK]
        acc = tl.zeros([1, BLOCK], tl.float32)
        acc_up = tl.zeros([1, BLOCK], tl.float32)
        for s in range(0, splits):
            acc += tl.load(base + s * stride_ps, mask=n_ok[None, :], other=0.0)
            if GATED:
                acc_up += tl.load(base + s * stride_ps + up_offset, mask=n_ok[None, :], other=0.0)
        y = _finish(acc, acc_up, bias_ptr, offs_n, n_ok, out_ptr.dtype.element_ty, GATED, ACT, HAS_BIAS)
        tl.store(out_ptr + row * stride_om + offs_n[None, :], y, mask=n_ok[None, :])


COMBINE_BLOCK = 256  # columns per program of the combine kernel


def _launch(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    out: Tensor | None,
    config: GemvConfig,
    rows: int,
    gated: bool,
    act: str,
) -> Tensor:
    """Run the kernel(s) for ``x [..., K]`` (checked); returns ``out`` or a new ``[..., n_out]``."""
    n, k = weight.shape
    n_out = n // 2 if gated else n
    up_offset = n_out if gated else 0
    x2 = x.reshape(rows, k)  # a view when x's leading dims allow it, else a copy (sized by shape)
    if out is None:
        out = torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = out.view(rows, n_out)
    if n_out == 0:
        return out  # nothing to compute (and a grid of zero programs is not a launch)
    k_per_split, splits = split_plan(k, config.block_k, config.split_k)
    # tl.dot needs 16 rows at least (zero-padded); the multiply-and-add path pads to a power of two.
    rows_pad = triton.next_power_of_2(rows) if config.path == "fma" else max(16, triton.next_power_of_2(rows))
    # Partials hold gate and up columns side by side ([S, M, 2I]) for the gated kernel.
    part = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device) if splits > 1 else out2
    # The kernel reads the bias with unit stride: a strided view is copied (by shape: capturable).
    bias_arg = bias.contiguous() if bias is not None else out2  # out2 is never read without HAS_BIAS
    common: dict[str, Any] = {
        "GATED": gated, "ACT": _ACT_CODES[act], "HAS_BIAS": bias is not None, **pdl_options(x.device),
    }  # fmt: skip
    _gemv_kernel[(triton.cdiv(n_out, config.block_n), splits)](
        x2, weight, bias_arg, out2, part,
        rows, n_out, k, k_per_split // config.block_k, up_offset,
        x2.stride(0), x2.stride(1), out2.stride(0), part.stride(0) if splits > 1 else 0, part.stride(-2),
        ROWS_PAD=rows_pad, BLOCK_N=config.block_n, BLOCK_K=config.block_k, PATH=PATHS.index(config.path),
        EVEN_N=n_out % config.block_n == 0, EVEN_K=splits * k_per_split == k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WRITE_PARTIALS=splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages, **common,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(triton.cdiv(n_out, COMBINE_BLOCK), rows)](
            part, bias_arg, out2, splits, n_out, up_offset, part.stride(0), part.stride(1), out2.stride(0),
            BLOCK=COMBINE_BLOCK, num_warps=4, **common,
        )  # fmt: skip
    return out


def linear_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    config: GemvConfig | None = None,
) -> Tensor:
    """The kernel for :func:`linear_reference` (``x [..., K]`` with 1..MAX_ROWS rows; CUDA, or CPU
    tensors under ``TRITON_INTERPRET=1``). ``config`` overrides :func:`gemv_config` (tests, sweeps)."""
    check_linear_args(x, weight, bias, out)
    rows = _check_kernel_args(x, weight, config, "linear")
    if config is None:
        config = gemv_config(weight.shape[0], weight.shape[1], rows)
    return _launch(x, weight, bias, out, config, rows, gated=False, act="silu")


def gated_mlp_triton(
    x: Tensor, weight: Tensor, act: str, *, out: Tensor | None = None, config: GemvConfig | None = None
) -> Tensor:
    """The kernel for :func:`gated_mlp_reference`; as :func:`linear_triton`."""
    check_gated_args(x, weight, act, out)
    rows = _check_kernel_args(x, weight, config, "gated_mlp")
    if config is None:
        config = gemv_config(weight.shape[0], weight.shape[1], rows, gated=True)
    return _launch(x, weight, None, out, config, rows, gated=True, act=act)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, out: Tensor | None = None) -> Tensor:
    """:func:`linear_reference`'s contract, dispatching to the kernel where it applies (module docstring).

    ``out``: write the result there (shape ``[..., N]``, x's dtype and device, contiguous).
    """
    check_linear_args(x, weight, bias, out)
    if _kernel_eligible(x, weight) and tuple(weight.shape) not in CUBLAS_SHAPES:
        if out is None:  # through the custom op: one opaque node under torch.compile
            return torch.ops.infer_ref.gemv_linear(x, weight, bias)
        return linear_triton(x, weight, bias, out=out)
    y = linear_reference(x, weight, bias)
    return y if out is None else out.copy_(y)


def gated_mlp(x: Tensor, weight: Tensor, act: str, *, out: Tensor | None = None) -> Tensor:
    """:func:`gated_mlp_reference`'s contract, dispatching to the kernel where it applies."""
    check_gated_args(x, weight, act, out)
    if _kernel_eligible(x, weight):
        if out is None:
            return torch.ops.infer_ref.gemv_gated_mlp(x, weight, act)
        return gated_mlp_triton(x, weight, act, out=out)
    y = _gated_product(x, weight, act)  # the reference, already checked
    return y if out is None else out.copy_(y)


# -- custom ops ------------------------------------------------------------------------------------
# torch.compile sees each call as one opaque node: Inductor neither re-lays out the kernel's inputs
# nor launches the kernel itself, so the launch keeps its options (programmatic dependent launch,
# infer_ref/kernels/pdl.py) and its tuned configuration.


@torch.library.custom_op("infer_ref::gemv_linear", mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return linear_triton(x, weight, bias)


@_linear_op.register_fake
def _linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("infer_ref::gemv_gated_mlp", mutates_args=())
def _gated_op(x: Tensor, weight: Tensor, act: str) -> Tensor:
    return gated_mlp_triton(x, weight, act)


@_gated_op.register_fake
def _gated_fake(x: Tensor, weight: Tensor, act: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


__all__ = [
    "ACTIVATIONS",
    "CUBLAS_SHAPES",
    "GATED_CONFIGS",
    "LINEAR_CONFIGS",
    "MAX_ROWS",
    "PATHS",
    "GemvConfig",
    "check_gated_args",
    "check_linear_args",
    "decode_projections",
    "default_config",
    "gated_mlp",
    "gated_mlp_reference",
    "gated_mlp_triton",
    "gemv_config",
    "linear",
    "linear_reference",
    "linear_triton",
    "split_plan",
]
