"""The decode matrix-vector kernels on CUDA (``pytest -m gpu tests/kernels/test_gemv_gpu.py``).

Every check draws fresh random inputs (weights N(0, 1/K), inputs N(0, 1), biases N(0, 1): outputs
of order one, as in a model) and hands the kernel an output buffer full of NaN, so an element it
fails to write shows.

Tolerance: the kernel is compared with a float64 oracle of the same rounding steps
(``infer_ref.conformance.oracles.gemv``): the exact product (plus bias) rounded to the dtype, and for
the gated kernel ``round(round(act(round g)) * round u)``. The bound is derived there: float32
accumulation of K products is within ``(K + 2) * 2**-24 * (|x| @ |W|^T + |b|)`` of the exact sum,
and each rounding to the dtype may land one ulp away from the oracle's when the two values straddle
a rounding boundary; the gated epilogue passes errors on through the activation's slope (<= 1.13)
and the product. In bf16 that is about one bf16 ulp (2**-8 relative) per output, in float32 about
``K * 2**-24`` relative: a wrong column, row, split or tile is off by far more.

The fused stages (in_norm, out_norm, residual) are held to the oracle's intervals: with random
inputs those add the accumulation bound's effect; with sums exact in float32 (integer-grid inputs,
or a permutation weight through which the output is the normalised input itself) they are one
value per element except where the norm's rstd may round differently, so every rounding of the
prologue and epilogue is checked. Each family's projections are checked with the stages its block
really folds in (``decode_stages``), and a captured chain of whole layers with
``weight_is_constant`` (the first weight tile read before the dependency wait) must equal the same
chain run eagerly, bit for bit.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from benchmarks.bench_gemv import FusedStages, decode_projections, decode_stages
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS
from infer_ref.conformance.oracles.gemv import gated_epilogue_oracle, gated_oracle, linear_oracle, violations
from infer_ref.fast.kernels import gemv
from infer_ref.fast.kernels.common import ENV_SWITCH, device_profile
from infer_ref.fast.kernels.gemv import (
    CUBLAS_SHAPES,
    GATED_CONFIGS,
    LINEAR_CONFIGS,
    MAX_ROWS,
    TABLE_ROWS,
    GemvConfig,
    default_config,
    gated_mlp,
    gated_mlp_reference,
    gated_mlp_triton,
    gemv_config,
    linear,
    linear_reference,
    linear_triton,
    split_plan,
)
from infer_ref.fast.kernels.gemv import launch as gemv_launch
from infer_ref.fast.switch import decode_kernels
from infer_ref.norm import NormSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gemv.HAVE_TRITON, reason="needs Triton (the kernels under test)"),
]

CUDA = "cuda"
ACTS = ["silu", "gelu_pytorch_tanh"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]


def _inputs(
    rows: tuple[int, ...], n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(*rows, k, generator=g, device=CUDA, dtype=torch.float32).to(dtype)
    w = (torch.randn(n, k, generator=g, device=CUDA, dtype=torch.float32) / math.sqrt(k)).to(dtype)
    b = torch.randn(n, generator=g, device=CUDA, dtype=torch.float32).to(dtype)
    return x, w, b


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=CUDA)


def _check_linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, config: GemvConfig | None, what: str
) -> None:
    out = _poisoned((*x.shape[:-1], w.shape[0]), x.dtype)
    assert linear_triton(x, w, b, out=out, config=config) is out
    problem = violations(out, *linear_oracle(x, w, b))
    assert problem is None, f"{what}: {problem}"


def _check_gated(x: torch.Tensor, w: torch.Tensor, act: str, config: GemvConfig | None, what: str) -> None:
    out = _poisoned((*x.shape[:-1], w.shape[0] // 2), x.dtype)
    assert gated_mlp_triton(x, w, act, out=out, config=config) is out
    problem = violations(out, *gated_oracle(x, w, act))
    assert problem is None, f"{what}: {problem}"


def _real_cases() -> list[tuple[str, int, int, bool, str]]:
    """(name, N, K, gated, act) for every projection of the three real shapes, shared shapes once."""
    seen: dict[tuple[int, int, bool], tuple[str, int, int, bool, str]] = {}
    for model, hf in REAL_SHAPE_CONFIGS.items():
        config = ModelConfig.from_hf_dict(hf)
        for proj, (n, k, gated) in decode_projections(config).items():
            seen.setdefault((n, k, gated), (f"{model}/{proj}", n, k, gated, config.hidden_act))
    return list(seen.values())


REAL_CASES = _real_cases()


@pytest.mark.parametrize(("name", "n", "k", "gated", "act"), REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_table_and_default_configs_on_the_real_shapes(
    name: str, n: int, k: int, gated: bool, act: str
) -> None:
    """The configuration the dispatch picks (the table's or the heuristic's) and the heuristic's own,
    rows 1..MAX_ROWS (the tables are tuned at 1 row but serve every row count)."""
    n_out = n // 2 if gated else n
    device = device_profile(torch.device(CUDA))
    configs = {
        "picked": gemv_config(n, k, 1, gated=gated, device=device),
        "heuristic": default_config(n_out, k, 1, device=device),
    }
    for label, config in configs.items():
        for rows in (1, 2, 4, MAX_ROWS):
            seed = zlib.crc32(f"{name} {label} {rows}".encode())
            x, w, b = _inputs((rows,), n, k, torch.bfloat16, seed)
            what = f"{name} {label} {config} rows {rows}"
            if gated:
                _check_gated(x, w, act, config, what)
            else:
                _check_linear(x, w, b, config, what)
                _check_linear(x, w, None, config, what + " (no bias)")


# Every entry of every device's table (keys: (capability, (N, K))): each must compute correctly
# on whichever GPU runs the tests.
TABLE_ENTRIES = [(False, shape, c) for (_, shape), c in LINEAR_CONFIGS.items()] + [
    (True, shape, c) for (_, shape), c in GATED_CONFIGS.items()
]


@pytest.mark.parametrize(
    ("gated", "key", "config"),
    TABLE_ENTRIES,
    ids=[f"{'gated' if g else 'linear'}-{k[0]}x{k[1]}" for g, k, _ in TABLE_ENTRIES],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_table_entry_in_every_dtype(
    gated: bool, key: tuple[int, int], config: GemvConfig, dtype: torch.dtype
) -> None:
    n, k = key
    # A table entry applies up to TABLE_ROWS rows (gemv_config); more rows are checked on the
    # tl.dot paths, which the dispatch can reach with them.
    for rows in (1, 3, MAX_ROWS) if config.path != "fma" else range(1, TABLE_ROWS + 1):
        x, w, b = _inputs((rows,), n, k, dtype, 7 * rows + n)
        what = f"table {key} {config} {dtype} rows {rows}"
        if gated:
            for act in ACTS:
                _check_gated(x, w, act, config, f"{what} {act}")
        else:
            _check_linear(x, w, b, config, what)


# Odd sizes: N and K multiples of neither the blocks nor 16 (partial column blocks, a partial last tile).
ODD_N, ODD_K = 333, 517
ODD_CONFIGS = [
    GemvConfig(32, 64, 1, 4, 3, "dot"),
    GemvConfig(32, 64, 3, 4, 3, "dot"),  # 9 tiles: 3 per slice
    GemvConfig(64, 32, 32, 8, 2, "dot"),  # more slices than tiles asked: one per tile (17)
    GemvConfig(64, 64, 1, 4, 3, "dot_t"),
    GemvConfig(64, 128, 2, 4, 3, "dot_t"),  # 5 tiles: 3 per slice, 2 slices launched
    GemvConfig(16, 128, 1, 4, 2, "fma"),
    GemvConfig(8, 128, 4, 4, 2, "fma"),  # 5 tiles: 2 per slice, 3 slices launched
    # Two weight tiles before the dependency wait: slices of 9 tiles, of 3, of 2 (the whole slice)
    # and of 1 (17 slices: the host caps the prefetch at one tile).
    GemvConfig(32, 64, 1, 4, 3, "dot", prefetch_tiles=2),
    GemvConfig(64, 128, 2, 4, 3, "dot_t", prefetch_tiles=2),
    GemvConfig(4, 128, 3, 4, 3, "fma", prefetch_tiles=2),
    GemvConfig(64, 32, 32, 8, 2, "fma", prefetch_tiles=2),
    # The K loop loading each weight tile before the x tile, on each path.
    GemvConfig(32, 64, 3, 4, 3, "dot", weight_first=True),
    GemvConfig(64, 64, 1, 4, 3, "dot_t", weight_first=True),
    GemvConfig(8, 128, 1, 4, 2, "fma", weight_first=True),
]


def _config_id(c: GemvConfig) -> str:
    return f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}-w{c.num_warps}-{c.path}-p{c.prefetch_tiles}{'-wf' if c.weight_first else ''}"


@pytest.mark.parametrize("config", ODD_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_odd_shapes_every_row_count(config: GemvConfig, dtype: torch.dtype) -> None:
    assert split_plan(ODD_K, config.block_k, config.split_k)[1] >= (1 if config.split_k == 1 else 2)
    for rows in range(1, MAX_ROWS + 1):
        x, w, b = _inputs((rows,), ODD_N, ODD_K, dtype, 100 * rows + config.split_k)
        _check_linear(x, w, b, config, f"linear {dtype} rows {rows}")
        _check_linear(x, w, None, config, f"linear no bias {dtype} rows {rows}")
        xg, wg, _ = _inputs((rows,), 2 * 171, ODD_K, dtype, 200 * rows + config.split_k)
        for act in ACTS:
            _check_gated(xg, wg, act, config, f"gated {act} {dtype} rows {rows}")


def _exact_inputs(
    rows: int, n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs whose products and sums are exact in float32: x in {-1, 0, 1}; weights and bias
    ``j / 1024`` with ``|j| <= 512`` rounded to the dtype (still multiples of 2**-10 in [-1/2, 1/2]).
    Every partial sum is a multiple of 2**-10 below ``K / 2 + 1/2`` in magnitude: 21 bits for
    K = 2048, exact in float32, so any summation order gives the exact value and only the
    roundings to the dtype remain (typical sums, of order 10, need about 14 bits: more than bf16's
    8 or fp16's 11, so those roundings do happen)."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randint(-1, 2, (rows, k), generator=g, device=CUDA).to(dtype)
    w = (torch.randint(-512, 513, (n, k), generator=g, device=CUDA) / 1024).to(dtype)
    b = (torch.randint(-512, 513, (n,), generator=g, device=CUDA) / 1024).to(dtype)
    return x, w, b


EXACT_CONFIGS = [
    GemvConfig(32, 128, 1, 4, 4, "dot"),
    GemvConfig(32, 128, 4, 4, 4, "dot"),
    GemvConfig(64, 128, 2, 4, 3, "dot_t"),
    GemvConfig(16, 256, 1, 4, 2, "fma"),
]


@pytest.mark.parametrize("config", EXACT_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_exact_sums_round_like_eager_torch(config: GemvConfig, dtype: torch.dtype) -> None:
    """With exact sums the linear kernel must equal the exact result rounded once, bit for bit, and
    the gated kernel the eager ops on the rounded gate and up values, ``act(g) * u`` in the dtype.
    (Not F.linear itself: cuBLAS may reduce split-K partials in the 16-bit dtype.)

    The gated allowance: both compute the activation in float32 but with different ``exp``/``tanh``
    implementations, a few float32 ulps apart, so where the activation lands within that distance of
    a rounding midpoint of the dtype the two may round it one ulp apart: a fraction of about 2**-14
    of the elements, so at most 1% may differ. Every element must also meet the float64 oracle's bound
    (sums exact: only the rounding terms remain). Eager gelu-tanh computes ``1 + tanh(y)``, which
    cancels where ``tanh(y)`` nears -1 (the kernel uses the equal ``2 sigmoid(2y)``); where
    ``1 + tanh(y) < 1/64`` eager has lost six or more bits, so there only the oracle's bound applies.
    An epilogue that skips one of the roundings differs from eager in a large fraction of the elements.
    """
    n, k, rows = 2 * 1536, 2048, 4
    for seed in range(2):
        x, w, b = _exact_inputs(rows, n, k, dtype, 60 + seed)
        exact = x.double() @ w.double().T  # [rows, n], exact: float64 holds every partial sum
        out = _poisoned((rows, n), dtype)
        linear_triton(x, w, b, out=out, config=config)
        want = (exact + b.double()).to(dtype)  # exact in float32 too, so this is one rounding
        assert torch.equal(out, want), f"linear seed {seed}: {int((out != want).sum())} elements differ"
        g64, u64 = exact[:, : n // 2], exact[:, n // 2 :]
        g, u = g64.to(dtype), u64.to(dtype)
        for act in ACTS:
            got = gated_mlp_triton(x, w, act, config=config)
            problem = violations(
                got,
                *gated_epilogue_oracle(g64, u64, act, dtype, torch.zeros_like(g64), torch.zeros_like(u64)),
            )
            assert problem is None, f"gated {act} seed {seed}: {problem}"
            eager = gemv.ACTIVATIONS[act](g) * u  # the eager ops, rounding after each
            compared = torch.ones_like(got, dtype=torch.bool)
            if act == "gelu_pytorch_tanh":
                gd = g.double()
                compared = 1.0 + torch.tanh(math.sqrt(2 / math.pi) * (gd + 0.044715 * gd**3)) >= 1 / 64
            differ = (got != eager) & compared
            assert differ.float().sum().item() <= 0.01 * compared.sum().item(), (
                f"gated {act} seed {seed}: {int(differ.sum())} of {int(compared.sum())} elements differ from the eager ops"
            )


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_leading_dims_and_a_strided_x(dtype: torch.dtype) -> None:
    """x ``[2, 3, K]`` taken as every other row of a bigger tensor (row stride 2K) and a bias taken as
    every other element of a bigger one, default configs."""
    big, w, _ = _inputs((2, 6), 2048, 2048, dtype, 5)
    _, _, wide_b = _inputs((1,), 4096, 16, dtype, 6)
    x, b = big[:, ::2], wide_b[::2]
    _check_linear(x, w, b, None, f"strided x and bias {dtype}")
    _check_gated(x, w, "silu", None, f"strided x gated {dtype}")


def test_dispatch_on_cuda() -> None:
    """Switched on: the kernel (bitwise what linear_triton gives); off, too many rows, or a shape
    listed in CUBLAS_SHAPES: F.linear."""
    x, w, b = _inputs((1, 1), 3000, 2048, torch.bfloat16, 11)
    kept_x, kept_w, kept_b = _inputs((1, 1), *sorted(CUBLAS_SHAPES)[0], torch.bfloat16, 12)
    with decode_kernels():
        assert torch.equal(linear(kept_x, kept_w, kept_b), linear_reference(kept_x, kept_w, kept_b))
        assert torch.equal(linear(x, w, b), linear_triton(x, w, b))
        assert torch.equal(gated_mlp(x, w, "silu"), gated_mlp_triton(x, w, "silu"))
        many = torch.randn(MAX_ROWS + 1, 2048, device=CUDA, dtype=torch.bfloat16)
        assert torch.equal(linear(many, w, b), linear_reference(many, w, b))
    assert torch.equal(linear(x, w, b), linear_reference(x, w, b))
    assert torch.equal(gated_mlp(x, w, "silu"), gated_mlp_reference(x, w, "silu"))


def test_under_torch_compile_the_switch_is_guarded() -> None:
    """A compiled caller sees the switch: off it runs the reference ops (which Inductor may fuse, so
    they are held to the oracle, not bitwise), on (a recompile: the switch is a guarded global) the
    kernels, bit for bit. Without the guard the second call would replay the first graph."""
    x, w, b = _inputs((1, 1), 2000, 2048, torch.bfloat16, 13)  # not a CUBLAS_SHAPES entry
    _, wg, _ = _inputs((1,), 2 * 4096, 2048, torch.bfloat16, 14)

    @torch.compile(fullgraph=False)
    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return linear(x, w, b), gated_mlp(x, wg, "silu")

    y, z = step(x)
    assert violations(y, *linear_oracle(x, w, b)) is None
    assert violations(z, *gated_oracle(x, wg, "silu")) is None
    with decode_kernels():
        y, z = step(x)
        assert torch.equal(y, linear_triton(x, w, b)), "compiled linear is not the kernel's result"
        assert torch.equal(z, gated_mlp_triton(x, wg, "silu")), (
            "compiled gated MLP is not the kernel's result"
        )


def test_split_results_are_deterministic() -> None:
    """Partials are summed in a fixed order (no atomics): two runs agree bit for bit."""
    config = GemvConfig(32, 128, 8, 4, 4, "dot")
    x, w, b = _inputs((4,), 2048, 8192, torch.bfloat16, 12)
    assert torch.equal(linear_triton(x, w, b, config=config), linear_triton(x, w, b, config=config))
    assert torch.equal(
        gated_mlp_triton(x, w, "silu", config=config), gated_mlp_triton(x, w, "silu", config=config)
    )


def test_captured_calls_follow_changed_inputs() -> None:
    """Captured in a CUDA graph, replayed after x and the weights change in place: each replay equals
    a fresh oracle. The dispatching calls take whatever configuration they pick; one more call forces
    split K, so float32 partials are allocated inside the capture."""
    n, k, n_gated = 2048, 2048, 2 * 4096
    split = GemvConfig(32, 128, 4, 4, 4, "dot")
    assert split_plan(k, split.block_k, split.split_k)[1] == 4
    x, w, b = _inputs((1, 1), n, k, torch.bfloat16, 20)
    _, wg, _ = _inputs((1,), n_gated, k, torch.bfloat16, 21)

    def step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return linear(x, w, b), gated_mlp(x, wg, "gelu_pytorch_tanh"), linear_triton(x, w, b, config=split)

    with decode_kernels():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # compile and warm up off the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, z, y_split = step()
    for seed in range(3):
        fresh_x, fresh_w, fresh_b = _inputs((1, 1), n, k, torch.bfloat16, 30 + seed)
        _, fresh_wg, _ = _inputs((1,), n_gated, k, torch.bfloat16, 40 + seed)
        for static, fresh in ((x, fresh_x), (w, fresh_w), (b, fresh_b), (wg, fresh_wg)):
            static.copy_(fresh)
        for captured in (y, z, y_split):
            captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_linear = linear_oracle(fresh_x, fresh_w, fresh_b)
        for label, got in (("linear", y), ("linear split 4", y_split)):
            problem = violations(got, *want_linear)
            assert problem is None, f"replay {seed}, {label}: {problem}"
        problem = violations(z, *gated_oracle(fresh_x, fresh_wg, "gelu_pytorch_tanh"))
        assert problem is None, f"replay {seed}, gated: {problem}"


def test_weights_past_int32_addressing() -> None:
    """A weight of more than 2**31 elements (4.3 GB in bf16): row * K overflows int32. Checked on its
    first and last rows against the oracle of those rows."""
    n, k = 2**31 // 2048 + 256, 2048
    w = torch.empty(n, k, dtype=torch.bfloat16, device=CUDA)
    g = torch.Generator(device=CUDA).manual_seed(50)
    for start in range(0, n, 2**18):  # fill in chunks (a float32 draw of the whole would need 8.6 GB)
        rows = w[start : start + 2**18]
        rows.copy_(torch.randn(rows.shape, generator=g, device=CUDA) / math.sqrt(k))
    x = torch.randn(2, k, generator=g, device=CUDA).to(torch.bfloat16)
    for config in (
        GemvConfig(64, 128, 1, 4, 4, "dot"),
        GemvConfig(64, 128, 1, 4, 4, "dot_t"),
        GemvConfig(32, 128, 2, 4, 2, "fma"),
    ):
        out = linear_triton(x, w, config=config)
        for part in (slice(0, 300), slice(n - 300, n)):
            problem = violations(out[:, part], *linear_oracle(x, w[part]))
            assert problem is None, f"{config} rows {part}: {problem}"
        gated = gated_mlp_triton(x, w[: n // 2 * 2], "silu", config=config)  # up rows sit past 2**31 elements
        i = n // 2
        for cols in (slice(0, 300), slice(i - 300, i)):
            stacked = torch.cat([w[cols], w[i + cols.start : i + cols.stop]])
            problem = violations(gated[:, cols], *gated_oracle(x, stacked, "silu"))
            assert problem is None, f"gated {config} columns {cols}: {problem}"


def test_a_captured_chain_reads_each_predecessors_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight dependent products, each launched with programmatic dependent launch where the GPU
    has it (kernels/common.py), captured in one graph: every kernel must wait for the one before it.
    A kernel that read x before its grid-dependency wait would see its predecessor's unfinished
    output. Expected: the same chain run eagerly with PDL switched off, bit for bit (the kernels
    are deterministic), for two different inputs replayed through the same graph."""
    n = 2048  # square, so each output feeds the next product; Llama's o shape (a table entry)
    g = torch.Generator(device=CUDA).manual_seed(21)
    weights = [
        (torch.randn(n, n, generator=g, device=CUDA) / math.sqrt(n)).to(torch.bfloat16) for _ in range(8)
    ]
    x = torch.empty(1, n, device=CUDA, dtype=torch.bfloat16)

    def chain() -> torch.Tensor:
        y = x
        for w in weights:
            y = linear_triton(y, w)
        return y

    x.copy_(torch.randn(1, n, generator=g, device=CUDA))
    chain()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    inputs = [torch.randn(1, n, generator=g, device=CUDA).to(torch.bfloat16) for _ in range(2)]
    replayed = []
    for value in inputs:
        x.copy_(value)
        graph.replay()
        replayed.append(captured.clone())
    monkeypatch.setenv(ENV_SWITCH, "0")
    for value, got in zip(inputs, replayed, strict=True):
        x.copy_(value)
        assert torch.equal(got, chain()), (
            "a captured kernel read its input before the previous kernel finished"
        )


# -- the fused stages ------------------------------------------------------------------------------


def _norm(d: int, dtype: torch.dtype, unit_offset: bool, seed: int) -> NormSpec:
    """Norm weights as trained models have them: Llama's around 1, Gemma's offsets around 0."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    w = torch.randn(d, generator=g, device=CUDA, dtype=torch.float32)
    return NormSpec((0.5 * w if unit_offset else 1.0 + 0.3 * w).to(dtype), 1e-6, unit_offset)


def _residual(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return (2.0 * torch.randn(*shape, generator=g, device=CUDA, dtype=torch.float32)).to(dtype)


def _stage_args(
    st: FusedStages, rows: tuple[int, ...], n: int, k: int, dtype: torch.dtype, seed: int
) -> dict:
    return {
        "in_norm": _norm(k, dtype, st.unit_offset, seed + 1) if st.in_norm else None,
        "out_norm": _norm(n, dtype, st.unit_offset, seed + 2) if st.out_norm else None,
        "residual": _residual((*rows, n), dtype, seed + 3) if st.residual else None,
    }


def _staged_cases() -> list[tuple[str, int, int, bool, str, FusedStages]]:
    """(name, N, K, gated, act, stages) for each layer projection of the three families, with the
    stages its block folds in: qkv/gate_up in_norm, o/down residual (and out_norm for Gemma)."""
    cases = []
    for model, hf in REAL_SHAPE_CONFIGS.items():
        config = ModelConfig.from_hf_dict(hf)
        stages = decode_stages(config)
        for proj, (n, k, gated) in decode_projections(config).items():
            if proj != "lm_head":
                cases.append((f"{model}/{proj}", n, k, gated, config.hidden_act, stages[proj]))
    return cases


STAGED_CASES = _staged_cases()


def _check_staged(
    x: torch.Tensor,
    w: torch.Tensor,
    gated: bool,
    act: str,
    kw: dict,
    constant: bool,
    config: GemvConfig | None,
    what: str,
) -> torch.Tensor:
    if gated:
        out = _poisoned((*x.shape[:-1], w.shape[0] // 2), x.dtype)
        gated_mlp_triton(
            x, w, act, out=out, in_norm=kw["in_norm"], weight_is_constant=constant, config=config
        )
        problem = violations(out, *gated_oracle(x, w, act, in_norm=kw["in_norm"]))
    else:
        out = _poisoned((*x.shape[:-1], w.shape[0]), x.dtype)
        assert linear_triton(x, w, out=out, **kw, weight_is_constant=constant, config=config) is out
        problem = violations(out, *linear_oracle(x, w, **kw))
    assert problem is None, f"{what}: {problem}"
    return out


@pytest.mark.parametrize(
    ("name", "n", "k", "gated", "act", "stages"), STAGED_CASES, ids=[c[0] for c in STAGED_CASES]
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_stages_on_real_shapes(
    name: str, n: int, k: int, gated: bool, act: str, stages: FusedStages, dtype: torch.dtype
) -> None:
    """Each family's projections with the stages they really use, the configuration the dispatch
    picks (rows 1: the table's; more: the heuristic's), weight_is_constant off and on, fresh inputs
    per call, poisoned outputs."""
    for rows in (1, 4):
        for constant in (False, True):
            seed = zlib.crc32(f"{name} {dtype} {rows} {constant}".encode())
            x, w, _ = _inputs((rows,), n, k, dtype, seed)
            kw = _stage_args(stages, (rows,), n, k, dtype, seed)
            _check_staged(
                x,
                w,
                gated,
                act,
                kw,
                constant,
                None,
                f"{name} {stages} {dtype} rows {rows} constant={constant}",
            )


# Stage sets for the odd shapes: (in_norm formula, out_norm formula, residual, bias); None: absent.
ODD_STAGES = [
    ("llama", None, False, False),
    ("gemma", None, True, True),
    (None, None, True, True),
    (None, "llama", True, False),
    ("llama", "gemma", True, True),
    (None, "gemma", False, False),
]


@pytest.mark.parametrize("config", ODD_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_stages_odd_shapes_every_path(config: GemvConfig, dtype: torch.dtype) -> None:
    """Every stage set on every path, unsplit and split (more slices than tiles too), partial blocks
    and tiles, rows 1..8, weight_is_constant alternating; the gated kernel with either in_norm."""
    for rows in (1, 2, 3, 5, MAX_ROWS):
        for i, (fin, fout, residual, bias) in enumerate(ODD_STAGES):
            seed = 1000 * rows + 10 * i + config.split_k
            x, w, b = _inputs((rows,), ODD_N, ODD_K, dtype, seed)
            kw = {
                "bias": b if bias else None,
                "in_norm": _norm(ODD_K, dtype, fin == "gemma", seed + 1) if fin else None,
                "out_norm": _norm(ODD_N, dtype, fout == "gemma", seed + 2) if fout else None,
                "residual": _residual((rows, ODD_N), dtype, seed + 3) if residual else None,
            }
            out = _poisoned((rows, ODD_N), dtype)
            linear_triton(x, w, out=out, **kw, weight_is_constant=(i + rows) % 2 == 0, config=config)
            problem = violations(out, *linear_oracle(x, w, **kw))
            assert problem is None, f"{ODD_STAGES[i]} {dtype} rows {rows}: {problem}"
        xg, wg, _ = _inputs((rows,), 2 * 171, ODD_K, dtype, 200 * rows + config.split_k)
        for j, act in enumerate(ACTS):
            kw = {"in_norm": _norm(ODD_K, dtype, j == 1, 300 * rows + j)}
            _check_staged(
                xg, wg, True, act, kw, (j + rows) % 2 == 0, config, f"gated {act} in_norm {dtype} rows {rows}"
            )


def _permutation(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``[n, k]``, one 1 per row at distinct random columns (n <= k): the product of a normalised x
    through it is that x's elements, every float32 sum exact."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    cols = torch.randperm(k, generator=g, device=CUDA)[:n]
    w = torch.zeros(n, k, dtype=dtype, device=CUDA)
    w[torch.arange(n, device=CUDA), cols] = 1.0
    return w


@pytest.mark.parametrize("config", EXACT_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_in_norm_rounds_like_rms_norm(config: GemvConfig, dtype: torch.dtype) -> None:
    """Through a permutation weight the output is the prologue's normalised x itself (K = 2048, the
    permutation crossing every K slice): it must equal the oracle exactly wherever its range is one
    value, so each rounding of either formula is checked, with rstd over all of K. Gated: gate and
    up are two permutations of the normalised x."""
    k = 2048
    for formula in (False, True):
        for rows in (1, 3):
            for constant in (False, True):
                x, _, _ = _inputs((rows,), 1, k, dtype, 500 + rows + 10 * formula)
                norm = _norm(k, dtype, formula, 600 + rows)
                w = _permutation(k, k, dtype, 700 + rows)
                got = linear_triton(x, w, in_norm=norm, weight_is_constant=constant, config=config)
                problem = violations(got, *linear_oracle(x, w, in_norm=norm, sums_exact=True))
                assert problem is None, f"unit_offset={formula} rows {rows} constant={constant}: {problem}"
                wg = torch.cat(
                    [_permutation(k // 2, k, dtype, 800 + rows), _permutation(k // 2, k, dtype, 900 + rows)]
                )
                got = gated_mlp_triton(
                    x, wg, "silu", in_norm=norm, weight_is_constant=constant, config=config
                )
                problem = violations(got, *gated_oracle(x, wg, "silu", in_norm=norm, sums_exact=True))
                assert problem is None, f"gated unit_offset={formula} rows {rows}: {problem}"


@pytest.mark.parametrize("config", EXACT_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_exact_sums_epilogue_rounds_like_eager(config: GemvConfig, dtype: torch.dtype) -> None:
    """With exact sums the product is round(exact): ``round(r32 + round(y))`` must equal eager's
    ``r + y`` bit for bit, with and without a bias (a residual added to the unrounded sum differs in
    a large fraction of the elements); the out_norm (either formula) then the residual must equal the
    oracle exactly wherever its range is one value, and eager torch's result there."""
    n, k, rows = 2048, 2048, 4
    for seed in range(2):
        x, w, b = _exact_inputs(rows, n, k, dtype, 70 + seed)
        r = _residual((rows, n), dtype, 80 + seed)
        exact = x.double() @ w.double().T
        for bias in (None, b):
            y = exact if bias is None else exact + bias.double()
            got = linear_triton(x, w, bias, residual=r, weight_is_constant=seed == 1, config=config)
            want = r + y.to(dtype)  # eager's add of the rounded product
            assert torch.equal(got, want), (
                f"bias={bias is not None}: {int((got != want).sum())} elements differ from r + round(y)"
            )
        for unit_offset in (False, True):
            norm = _norm(n, dtype, unit_offset, 90 + seed)
            got = linear_triton(x, w, b, residual=r, out_norm=norm, config=config)
            want, bound = linear_oracle(x, w, b, residual=r, out_norm=norm, sums_exact=True)
            assert violations(got, want, bound) is None, (
                f"out_norm unit_offset={unit_offset}: {violations(got, want, bound)}"
            )
            eager = linear_reference(x, w, b, residual=r, out_norm=norm)
            exact_elems = bound == 0
            assert torch.equal(got[exact_elems], eager[exact_elems]), (
                "differs from eager where the oracle is exact"
            )
            assert exact_elems.float().mean() > 0.9


def test_out_norm_over_a_row_wider_than_its_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """With OUT_NORM_BLOCK lowered to 256, Gemma's 1152-wide rows are walked in five blocks: the
    norm must still be over the whole row (exact sums: exact wherever the oracle's range is one value)."""
    monkeypatch.setattr(gemv_launch, "OUT_NORM_BLOCK", 256)
    n, k = 1152, 1024
    for config in (None, GemvConfig(32, 128, 4, 4, 4, "dot")):
        for unit_offset in (False, True):
            x, w, b = _exact_inputs(3, n, k, torch.bfloat16, 95)
            r = _residual((3, n), torch.bfloat16, 96)
            norm = _norm(n, torch.bfloat16, unit_offset, 97)
            got = linear_triton(x, w, b, residual=r, out_norm=norm, config=config)
            want, bound = linear_oracle(x, w, b, residual=r, out_norm=norm, sums_exact=True)
            assert violations(got, want, bound) is None, (
                f"{config} unit_offset={unit_offset}: {violations(got, want, bound)}"
            )


def test_fused_dispatch_on_cuda() -> None:
    """Switched on, the dispatching calls with stages give the kernel's result bit for bit (a
    CUBLAS_SHAPES weight too once it has an in_norm); off, the reference's."""
    x, w, _ = _inputs((1, 1), 2048, 2048, torch.bfloat16, 110)
    kw = {"in_norm": _norm(2048, torch.bfloat16, True, 111), "residual": _residual((1, 1, 2048), torch.bfloat16, 112),
          "out_norm": _norm(2048, torch.bfloat16, True, 113)}  # fmt: skip
    qn, qk = sorted(CUBLAS_SHAPES)[0]
    xq, wq, _ = _inputs((1, 1), qn, qk, torch.bfloat16, 114)
    nq = _norm(qk, torch.bfloat16, False, 115)
    with decode_kernels():
        assert torch.equal(linear(x, w, **kw, weight_is_constant=True), linear_triton(x, w, **kw))
        assert torch.equal(linear(xq, wq, in_norm=nq), linear_triton(xq, wq, in_norm=nq))
        assert torch.equal(
            gated_mlp(x, w, "silu", in_norm=kw["in_norm"]),
            gated_mlp_triton(x, w, "silu", in_norm=kw["in_norm"]),
        )
    assert torch.equal(linear(x, w, **kw), linear_reference(x, w, **kw))
    assert torch.equal(
        gated_mlp(x, w, "silu", in_norm=kw["in_norm"]),
        gated_mlp_reference(x, w, "silu", in_norm=kw["in_norm"]),
    )


def test_fused_custom_ops_under_torch_compile() -> None:
    """The stages travel through the custom ops (each NormSpec flattened to weight, eps, formula):
    a compiled caller gets the kernels' results bit for bit."""
    x, w, _ = _inputs((1, 1), 1152, 1024, torch.bfloat16, 120)
    _, wg, _ = _inputs((1,), 2 * 3456, 1152, torch.bfloat16, 121)
    n_in, n_out = _norm(1024, torch.bfloat16, True, 122), _norm(1152, torch.bfloat16, True, 123)
    n_g = _norm(1152, torch.bfloat16, False, 124)
    r = _residual((1, 1, 1152), torch.bfloat16, 125)

    @torch.compile(fullgraph=False)
    def step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = linear(x, w, in_norm=n_in, residual=r, out_norm=n_out, weight_is_constant=True)
        return y, gated_mlp(y, wg, "gelu_pytorch_tanh", in_norm=n_g, weight_is_constant=True)

    with decode_kernels():
        y, z = step(x, r)
    assert torch.equal(y, linear_triton(x, w, in_norm=n_in, residual=r, out_norm=n_out))
    assert torch.equal(z, gated_mlp_triton(y, wg, "gelu_pytorch_tanh", in_norm=n_g))


def test_fused_results_are_deterministic() -> None:
    """Split partials summed in order, norms over whole rows: two runs agree bit for bit."""
    config = GemvConfig(32, 128, 8, 4, 4, "dot")
    x, w, b = _inputs((4,), 2048, 8192, torch.bfloat16, 130)
    kw = {"in_norm": _norm(8192, torch.bfloat16, False, 131), "residual": _residual((4, 2048), torch.bfloat16, 132),
          "out_norm": _norm(2048, torch.bfloat16, True, 133)}  # fmt: skip
    first = linear_triton(x, w, b, **kw, config=config)
    for constant in (False, True):
        assert torch.equal(first, linear_triton(x, w, b, **kw, weight_is_constant=constant, config=config))
    g1 = gated_mlp_triton(x, w, "silu", in_norm=kw["in_norm"], config=config)
    assert torch.equal(
        g1, gated_mlp_triton(x, w, "silu", in_norm=kw["in_norm"], weight_is_constant=True, config=config)
    )


def test_captured_fused_calls_follow_changed_inputs() -> None:
    """Captured with every stage (one call forcing split K, so partials are allocated inside the
    capture, one with an out_norm and one split), replayed after x, the weights, the norm weights and
    the residual change in place: each replay meets a fresh oracle."""
    n, k = 2048, 2048
    split = GemvConfig(32, 128, 4, 4, 4, "dot")
    x, w, _ = _inputs((1, 1), n, k, torch.bfloat16, 140)
    _, wg, _ = _inputs((1,), 2 * 4096, k, torch.bfloat16, 141)
    n_in, n_out = _norm(k, torch.bfloat16, False, 142), _norm(n, torch.bfloat16, True, 143)
    r = _residual((1, 1, n), torch.bfloat16, 144)

    def step() -> tuple[torch.Tensor, ...]:
        return (
            linear(x, w, in_norm=n_in, residual=r, weight_is_constant=True),
            linear(x, w, residual=r, out_norm=n_out, weight_is_constant=True),
            linear_triton(
                x, w, in_norm=n_in, residual=r, out_norm=n_out, weight_is_constant=True, config=split
            ),
            gated_mlp(x, wg, "silu", in_norm=n_in, weight_is_constant=True),
        )

    with decode_kernels():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
    for seed in range(3):
        fx, fw, _ = _inputs((1, 1), n, k, torch.bfloat16, 150 + seed)
        _, fwg, _ = _inputs((1,), 2 * 4096, k, torch.bfloat16, 160 + seed)
        fin, fout = _norm(k, torch.bfloat16, False, 170 + seed), _norm(n, torch.bfloat16, True, 180 + seed)
        fr = _residual((1, 1, n), torch.bfloat16, 190 + seed)
        for static, fresh in (
            (x, fx),
            (w, fw),
            (wg, fwg),
            (n_in.weight, fin.weight),
            (n_out.weight, fout.weight),
            (r, fr),
        ):
            static.copy_(fresh)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        wants = [
            linear_oracle(fx, fw, in_norm=fin, residual=fr),
            linear_oracle(fx, fw, residual=fr, out_norm=fout),
            linear_oracle(fx, fw, in_norm=fin, residual=fr, out_norm=fout),
            gated_oracle(fx, fwg, "silu", in_norm=fin),
        ]
        for i, (got, want) in enumerate(zip(outs, wants, strict=True)):
            problem = violations(got, *want)
            assert problem is None, f"replay {seed}, call {i}: {problem}"


@pytest.mark.parametrize("model", sorted(REAL_SHAPE_CONFIGS))
def test_captured_layer_chain_with_constant_weights_matches_eager(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """Four layers of the family's projections as its blocks run them (qkv with in_norm, o adding to
    the residual stream, Gemma's out_norm, gate_up with in_norm, down adding), weight_is_constant and
    residual_is_settled on as the models call them, captured in one graph with programmatic dependent
    launch: every kernel reads its weight's first tile (o and down: also their residual, written two
    kernels earlier) before its predecessor finishes, and x and the partials only after. Expected:
    the same chain run eagerly with PDL off, bit for bit, for two inputs replayed through one graph.
    The chain's output is also held to a chain of oracles, layer by layer, on the first input."""
    config = ModelConfig.from_hf_dict(REAL_SHAPE_CONFIGS[model])
    shapes, stages = decode_projections(config), decode_stages(config)
    e, q_dim, act = (
        config.hidden_size,
        config.num_attention_heads * config.computed_head_dim,
        config.hidden_act,
    )
    dtype, layers = torch.bfloat16, 4
    params = []
    for layer in range(layers):
        p: dict = {}
        for proj in ("qkv", "o", "gate_up", "down"):
            n, k, _ = shapes[proj]
            p[proj] = _inputs((1,), n, k, dtype, 1000 * layer + n)[1]
            st = stages[proj]
            p[proj + "_in"] = _norm(k, dtype, st.unit_offset, 2000 * layer + k) if st.in_norm else None
            p[proj + "_out"] = _norm(n, dtype, st.unit_offset, 3000 * layer + n) if st.out_norm else None
        params.append(p)
    x = torch.empty(1, 1, e, device=CUDA, dtype=dtype)

    def chain() -> torch.Tensor:
        h = x
        for p in params:
            qkv = linear(h, p["qkv"], in_norm=p["qkv_in"], weight_is_constant=True)
            h = linear(
                qkv[..., :q_dim], p["o"], residual=h, out_norm=p["o_out"], weight_is_constant=True,
                residual_is_settled=True,
            )  # fmt: skip
            mid = gated_mlp(h, p["gate_up"], act, in_norm=p["gate_up_in"], weight_is_constant=True)
            h = linear(
                mid, p["down"], residual=h, out_norm=p["down_out"], weight_is_constant=True, residual_is_settled=True
            )
        return h

    g = torch.Generator(device=CUDA).manual_seed(4000)
    inputs = [torch.randn(1, 1, e, generator=g, device=CUDA).to(dtype) for _ in range(2)]
    with decode_kernels():
        x.copy_(inputs[0])
        chain()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = chain()
        replayed = []
        for value in inputs:
            x.copy_(value)
            graph.replay()
            replayed.append(captured.clone())
        monkeypatch.setenv(ENV_SWITCH, "0")
        for i, (value, got) in enumerate(zip(inputs, replayed, strict=True)):
            x.copy_(value)
            assert torch.equal(got, chain()), f"input {i}: the captured chain differs from the eager one"
    # One layer at a time against the oracle (each layer's input: the kernels' previous output).
    h = inputs[0]
    with decode_kernels():
        for layer, p in enumerate(params):
            qkv = linear(h, p["qkv"], in_norm=p["qkv_in"])
            assert violations(qkv, *linear_oracle(h, p["qkv"], in_norm=p["qkv_in"])) is None, (
                f"layer {layer} qkv"
            )
            o = linear(qkv[..., :q_dim], p["o"], residual=h, out_norm=p["o_out"])
            want = linear_oracle(qkv[..., :q_dim], p["o"], residual=h, out_norm=p["o_out"])
            assert violations(o, *want) is None, f"layer {layer} o"
            mid = gated_mlp(o, p["gate_up"], act, in_norm=p["gate_up_in"])
            assert violations(mid, *gated_oracle(o, p["gate_up"], act, in_norm=p["gate_up_in"])) is None, (
                f"layer {layer} gate_up"
            )
            h = linear(mid, p["down"], residual=o, out_norm=p["down_out"])
            assert (
                violations(h, *linear_oracle(mid, p["down"], residual=o, out_norm=p["down_out"])) is None
            ), f"layer {layer} down"
