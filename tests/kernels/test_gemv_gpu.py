"""The decode matrix-vector kernels on CUDA (``pytest -m gpu tests/kernels/test_gemv_gpu.py``).

Every check draws fresh random inputs (weights N(0, 1/K), inputs N(0, 1), biases N(0, 1): outputs
of order one, as in a model) and hands the kernel an output buffer full of NaN, so an element it
fails to write shows.

Tolerance: the kernel is compared with a float64 oracle of the same rounding steps
(``infer_ref.testing.gemv_oracle``): the exact product (plus bias) rounded to the dtype, and for
the gated kernel ``round(round(act(round g)) * round u)``. The bound is derived there: float32
accumulation of K products is within ``(K + 2) * 2**-24 * (|x| @ |W|^T + |b|)`` of the exact sum,
and each rounding to the dtype may land one ulp away from the oracle's when the two values straddle
a rounding boundary; the gated epilogue passes errors on through the activation's slope (<= 1.13)
and the product. In bf16 that is about one bf16 ulp (2**-8 relative) per output, in float32 about
``K * 2**-24`` relative: a wrong column, row, split or tile is off by far more.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from infer_ref.config import ModelConfig
from infer_ref.kernels import gemv
from infer_ref.kernels.gemv import (
    CUBLAS_SHAPES,
    GATED_CONFIGS,
    LINEAR_CONFIGS,
    MAX_ROWS,
    TABLE_ROWS,
    GemvConfig,
    decode_projections,
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
from infer_ref.kernels.pdl import ENV_SWITCH
from infer_ref.kernels.switch import decode_kernels
from infer_ref.testing.gemv_oracle import gated_epilogue_oracle, gated_oracle, linear_oracle, violations
from infer_ref.testing.synthetic import REAL_SHAPE_CONFIGS

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
    configs = {"picked": gemv_config(n, k, 1, gated=gated), "heuristic": default_config(n_out, k, 1)}
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


TABLE_ENTRIES = [(False, key, c) for key, c in LINEAR_CONFIGS.items()] + [
    (True, key, c) for key, c in GATED_CONFIGS.items()
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
]


def _config_id(c: GemvConfig) -> str:
    return f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}-w{c.num_warps}-{c.path}"


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
    has it (kernels/pdl.py), captured in one graph: every kernel must wait for the one before it.
    A kernel that read x before its grid-dependency wait would see its predecessor's unfinished
    output. Expected: the same chain run eagerly with PDL switched off, bit for bit (the kernels
    are deterministic), for two different inputs replayed through the same graph."""
    n = 2048  # square, so each output feeds the next product; Llama's o shape (a table entry)
    g = torch.Generator(device=CUDA).manual_seed(21)
    weights = [(torch.randn(n, n, generator=g, device=CUDA) / math.sqrt(n)).to(torch.bfloat16) for _ in range(8)]
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
        assert torch.equal(got, chain()), "a captured kernel read its input before the previous kernel finished"
