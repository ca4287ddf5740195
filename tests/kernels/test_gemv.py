"""The decode matrix-vector products on the CPU: references, dispatch, checks, launch plans.

The references are checked against float64 arithmetic written out here (sums of products, the
activation formulas), the gated reference against the models' ``MLP.forward``, and the bf16/fp16
references against the rounding chain the kernels copy (``infer_ref.testing.gemv_oracle``, whose
bound is derived in its docstring). On a CPU every dispatching call must take the reference.

Tests marked ``interpret`` run the Triton kernels themselves under Triton's CPU interpreter; they
skip unless ``TRITON_INTERPRET=1`` is set and Triton is importable:

    TRITON_INTERPRET=1 pytest -p no:cacheprovider -q tests/kernels/test_gemv.py -m interpret

One more ``interpret`` test, run when Triton is importable and ``TRITON_INTERPRET`` is not set,
compiles every launch configuration the dispatch or the sweep may use for an H100 (sm_90) without a
GPU, and checks that it fits one block's shared memory.

The interpreter runs float16 and float32 only: it converts float32 to bfloat16 by truncation (not
round-to-nearest-even as the GPU does) and misreads bfloat16 operands of ``tl.dot``, so bf16 is
checked on the GPU (``tests/kernels/test_gemv_gpu.py``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from benchmarks.bench_gemv import FMA_MAX_ROWS, TILES
from infer_ref.config import ModelConfig
from infer_ref.kernels import gemv, switch
from infer_ref.kernels.gemv import (
    MAX_ROWS,
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
from infer_ref.kernels.switch import decode_kernels, decode_kernels_enabled
from infer_ref.models.common import MLP
from infer_ref.testing.gemv_oracle import gated_oracle, linear_oracle, violations
from infer_ref.testing.synthetic import REAL_SHAPE_CONFIGS, TINY_CONFIGS

ACTS = ["silu", "gelu_pytorch_tanh"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _case(
    rows_shape: tuple[int, ...], n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ``[*rows_shape, k]`` N(0, 1), weight ``[n, k]`` N(0, 1/k), bias ``[n]`` N(0, 1): outputs of order 1."""
    g = _gen(seed)
    x = torch.randn(*rows_shape, k, generator=g, dtype=torch.float64).to(dtype)
    w = (torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)).to(dtype)
    b = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


# -- references against float64 arithmetic -------------------------------------------------------


def test_linear_reference_is_the_sum_of_products() -> None:
    x, w, b = _case((2, 3), 7, 11, torch.float64, 0)
    want = torch.empty(2, 3, 7, dtype=torch.float64)
    for i in range(2):
        for j in range(3):
            for n in range(7):
                want[i, j, n] = sum(float(x[i, j, kk]) * float(w[n, kk]) for kk in range(11)) + float(b[n])
    torch.testing.assert_close(linear_reference(x, w, b), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(linear_reference(x, w), want - b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", ACTS)
def test_gated_reference_is_act_of_gate_times_up(act: str) -> None:
    x, w, _ = _case((3,), 10, 9, torch.float64, 1)  # I = 5: gate rows 0..4, up rows 5..9
    g = (x[:, None, :] * w[None, :5, :]).sum(-1)
    u = (x[:, None, :] * w[None, 5:, :]).sum(-1)
    if act == "silu":
        a = g / (1.0 + torch.exp(-g))
    else:
        a = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
    torch.testing.assert_close(gated_mlp_reference(x, w, act), a * u, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_gated_reference_is_the_models_mlp(family: str) -> None:
    """``down(gated_mlp_reference(x, gate_up.weight))`` is ``MLP.forward`` bit for bit (the same ops)."""
    torch.manual_seed(0)
    config = ModelConfig.from_hf_dict(TINY_CONFIGS[family])
    mlp = MLP(config)
    x = torch.randn(2, 3, config.hidden_size)
    with torch.no_grad():
        ours = mlp.down_proj(gated_mlp_reference(x, mlp.gate_up_proj.weight, config.hidden_act))
        assert torch.equal(ours, mlp(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
def test_low_precision_references_round_like_the_oracle(dtype: torch.dtype, act: str) -> None:
    """Eager torch rounds where the kernels' epilogue rounds: the references meet the oracle's bound."""
    for seed in range(3):
        x, w, b = _case((4,), 96, 200, dtype, 10 + seed)
        problem = violations(linear_reference(x, w, b), *linear_oracle(x, w, b))
        assert problem is None, f"linear, seed {seed}: {problem}"
        problem = violations(gated_mlp_reference(x, w, act), *gated_oracle(x, w, act))
        assert problem is None, f"gated {act}, seed {seed}: {problem}"


def test_oracle_bound_catches_a_one_percent_error() -> None:
    """The bound is tight enough to matter: a 1% error in one bf16 output is caught."""
    x, w, b = _case((2,), 64, 256, torch.bfloat16, 3)
    want, bound = linear_oracle(x, w, b)
    got = want.clone()
    got[1, 5] *= 1.01
    assert violations(got.to(torch.bfloat16), want, bound) is not None


# -- dispatch --------------------------------------------------------------------------------------


def _forbid_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("the kernel path was taken")

    monkeypatch.setattr(gemv, "linear_triton", boom)
    monkeypatch.setattr(gemv, "gated_mlp_triton", boom)


@pytest.mark.parametrize("enabled", [False, True])
def test_cpu_calls_take_the_reference(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    _forbid_kernels(monkeypatch)
    x, w, b = _case((1, 1), 12, 16, torch.bfloat16, 4)
    with decode_kernels(enabled):
        assert _bits(linear(x, w, b)).equal(_bits(linear_reference(x, w, b)))
        assert _bits(gated_mlp(x, w, "silu")).equal(_bits(gated_mlp_reference(x, w, "silu")))


def test_out_receives_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_kernels(monkeypatch)
    x, w, b = _case((2, 1), 12, 16, torch.float32, 5)
    out = torch.full((2, 1, 12), float("nan"))
    assert linear(x, w, b, out=out) is out
    assert torch.equal(out, linear_reference(x, w, b))
    out_gated = torch.full((2, 1, 6), float("nan"))
    assert gated_mlp(x, w, "gelu_pytorch_tanh", out=out_gated) is out_gated
    assert torch.equal(out_gated, gated_mlp_reference(x, w, "gelu_pytorch_tanh"))


def test_rows_beyond_the_kernel_take_the_reference_and_float64_works() -> None:
    x, w, b = _case((MAX_ROWS + 3,), 12, 16, torch.float64, 6)
    with decode_kernels():
        torch.testing.assert_close(linear(x, w, b), x @ w.T + b, rtol=1e-12, atol=1e-12)


def test_switch_is_off_by_default_and_restores() -> None:
    assert decode_kernels_enabled() is False
    with decode_kernels():
        assert decode_kernels_enabled() is True
        with decode_kernels(False):
            assert decode_kernels_enabled() is False
        assert decode_kernels_enabled() is True
    assert decode_kernels_enabled() is False
    with pytest.raises(RuntimeError, match="inside"), decode_kernels():
        raise RuntimeError("inside")
    assert decode_kernels_enabled() is False, "an exception inside the block left the kernels on"
    assert switch._ENABLED is False


def test_switch_rejects_a_non_bool() -> None:
    with pytest.raises(TypeError, match="enabled must be a bool"), decode_kernels(1):  # type: ignore[arg-type]
        pass
    assert decode_kernels_enabled() is False


# -- bad inputs ------------------------------------------------------------------------------------

X, W, B = _case((1,), 8, 16, torch.float32, 7)
W_GATED = W  # 8 rows: I = 4
META_W = torch.empty(8, 16, device="meta")


def _bad_calls() -> list[tuple[str, Callable[[], Any], type[Exception], str]]:
    """(id, call, exception, message fragment): every entry point, every bad argument."""
    calls: list[tuple[str, Callable[[], Any], type[Exception], str]] = []
    for name, fn in (("linear", linear), ("linear_triton", linear_triton)):
        calls += [
            (f"{name}-x-not-tensor", lambda fn=fn: fn([1.0] * 16, W), TypeError, "must be tensors"),
            (f"{name}-weight-1d", lambda fn=fn: fn(X, W[0]), ValueError, "weight must be [N, K]"),
            (f"{name}-k-mismatch", lambda fn=fn: fn(X[:, :15], W), ValueError, "x must be [..., K=16]"),
            (f"{name}-x-0d", lambda fn=fn: fn(X[0, 0], W), ValueError, "x must be [..., K=16]"),
            (f"{name}-x-int", lambda fn=fn: fn(X.long(), W), TypeError, "floating-point"),
            (
                f"{name}-weight-dtype",
                lambda fn=fn: fn(X, W.double()),
                TypeError,
                "weight has dtype torch.float64",
            ),
            (f"{name}-weight-device", lambda fn=fn: fn(X, META_W), ValueError, "weight is on meta"),
            (f"{name}-bias-shape", lambda fn=fn: fn(X, W, B[:7]), ValueError, "bias must be [N=8]"),
            (
                f"{name}-bias-dtype",
                lambda fn=fn: fn(X, W, B.half()),
                TypeError,
                "bias has dtype torch.float16",
            ),
            (f"{name}-bias-device", lambda fn=fn: fn(X, W, B.to("meta")), ValueError, "bias is on meta"),
            (f"{name}-bias-not-tensor", lambda fn=fn: fn(X, W, 0.5), TypeError, "bias must be a tensor"),
        ]
    for name, fn in (("gated_mlp", gated_mlp), ("gated_mlp_triton", gated_mlp_triton)):
        calls += [
            (f"{name}-act", lambda fn=fn: fn(X, W_GATED, "relu"), ValueError, "unknown activation 'relu'"),
            (
                f"{name}-act-not-str",
                lambda fn=fn: fn(X, W_GATED, None),
                ValueError,
                "unknown activation None",
            ),
            (f"{name}-odd-rows", lambda fn=fn: fn(X, W_GATED[:7], "silu"), ValueError, "got 7 rows"),
            (f"{name}-no-rows", lambda fn=fn: fn(X, W_GATED[:0], "silu"), ValueError, "got 0 rows"),
            (
                f"{name}-k-mismatch",
                lambda fn=fn: fn(X[:, :3], W_GATED, "silu"),
                ValueError,
                "x must be [..., K=16]",
            ),
            (
                f"{name}-weight-dtype",
                lambda fn=fn: fn(X, W_GATED.half(), "silu"),
                TypeError,
                "weight has dtype",
            ),
            (f"{name}-weight-device", lambda fn=fn: fn(X, META_W, "silu"), ValueError, "weight is on meta"),
        ]
    # Only the kernels have these limits (the dispatching calls take the reference instead).
    calls += [
        ("linear_triton-no-rows", lambda: linear_triton(X[:0], W), ValueError, f"1..{MAX_ROWS} rows"),
        ("linear_triton-too-many-rows", lambda: linear_triton(X.expand(MAX_ROWS + 1, 16), W), ValueError, f"got {MAX_ROWS + 1}"),
        ("linear_triton-float64", lambda: linear_triton(X.double(), W.double()), TypeError, "the kernel takes"),
        ("linear_triton-strided-weight", lambda: linear_triton(X, W.T.contiguous().T), ValueError, "row-major contiguous"),
        ("linear_triton-empty-k", lambda: linear_triton(X[:, :0], W[:, :0]), ValueError, "K >= 1"),
        ("linear_triton-config", lambda: linear_triton(X, W, config=(32, 128)), TypeError, "config must be a GemvConfig"),
        ("gated_mlp_triton-too-many-rows", lambda: gated_mlp_triton(X.expand(9, 16), W_GATED, "silu"), ValueError, "1..8 rows"),
        ("gated_mlp_triton-strided-weight", lambda: gated_mlp_triton(X, W_GATED.T.contiguous().T, "silu"), ValueError, "row-major contiguous"),
    ]  # fmt: skip
    return calls


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize(
    ("call", "exc", "fragment"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_input_is_named(call: Callable[[], Any], exc: type[Exception], fragment: str) -> None:
    with pytest.raises(exc, match=re.escape(fragment)):
        call()


def _bad_outs() -> list[tuple[str, Callable[[], tuple[torch.Tensor, Any]], type[Exception], str]]:
    """``(x, out)`` pairs where ``out`` is bad; a good out would be ``[1, 8]`` float32."""

    def poisoned() -> torch.Tensor:
        return torch.full((1, 8), float("nan"))

    def aliased() -> tuple[torch.Tensor, torch.Tensor]:
        storage = torch.full((1, 16), float("nan"))
        return storage, storage[:, 8:]  # out is the second half of x

    return [
        ("shape", lambda: (X, poisoned()[:, :7]), ValueError, "out must be (1, 8)"),
        ("dtype", lambda: (X, poisoned().half()), TypeError, "out has dtype torch.float16"),
        ("device", lambda: (X, poisoned().to("meta")), ValueError, "out is on meta"),
        (
            "strided",
            lambda: (X, torch.full((1, 16), float("nan"))[:, ::2]),
            ValueError,
            "out must be contiguous",
        ),
        ("aliases-x", aliased, ValueError, "out shares memory with x"),
        ("not-tensor", lambda: (X, [0.0] * 8), TypeError, "out must be a tensor"),
    ]


BAD_OUTS = _bad_outs()
ENTRIES: dict[str, Callable[..., torch.Tensor]] = {
    "linear": linear,
    "linear_triton": linear_triton,
    "gated_mlp": gated_mlp,
    "gated_mlp_triton": gated_mlp_triton,
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize(("make", "exc", "fragment"), [c[1:] for c in BAD_OUTS], ids=[c[0] for c in BAD_OUTS])
def test_bad_out_is_named_and_untouched(
    entry: str, make: Callable[[], tuple[torch.Tensor, Any]], exc: type[Exception], fragment: str
) -> None:
    x, out = make()
    before = out.clone() if isinstance(out, torch.Tensor) and out.device.type != "meta" else None
    with pytest.raises(exc, match=re.escape(fragment)):
        if entry.startswith("gated"):
            ENTRIES[entry](x, torch.cat([W_GATED, W_GATED]), "silu", out=out)  # [16, 16]: I = 8
        else:
            ENTRIES[entry](x, W, out=out)
    if before is not None:
        assert _bits(out).equal(_bits(before)), "a rejected call wrote into out"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"block_n": 24, "block_k": 64}, "block_n must be a power of two >= 16 on the 'dot' path"),
        (
            {"block_n": 8, "block_k": 64, "path": "dot_t"},
            "block_n must be a power of two >= 16 on the 'dot_t' path",
        ),
        (
            {"block_n": 12, "block_k": 64, "path": "fma"},
            "block_n must be a power of two >= 1 on the 'fma' path",
        ),
        ({"block_n": 32, "block_k": 0}, "block_k must be a power of two >= 16"),
        ({"block_n": 32, "block_k": 8, "path": "fma"}, "block_k must be a power of two >= 16"),
        ({"block_n": True, "block_k": 64}, "block_n must be"),
        ({"block_n": 32, "block_k": 64, "split_k": 0}, "split_k must be a positive int"),
        ({"block_n": 32, "block_k": 64, "num_stages": 0}, "num_stages must be a positive int"),
        ({"block_n": 32, "block_k": 64, "num_warps": 3}, "num_warps must be one of"),
        ({"block_n": 32, "block_k": 64, "path": "mma"}, "path must be one of ('dot', 'dot_t', 'fma')"),
    ],
)
def test_bad_config_is_named(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        GemvConfig(**kwargs)


# -- launch plans ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "block_k", "split_k", "want"),
    [
        (2048, 128, 1, (2048, 1)),
        (2048, 128, 6, (384, 6)),  # 16 tiles: 3 per split, ceil(2048 / 384) = 6 slices
        (2048, 128, 5, (512, 4)),  # 16 tiles: ceil(16 / 5) = 4 per split, so only 4 slices
        (100, 32, 3, (64, 2)),  # 4 tiles (the last partial): 2 per split
        (100, 32, 8, (32, 4)),  # more splits than tiles: one per tile
        (7, 128, 4, (128, 1)),  # K shorter than a tile
    ],
)
def test_split_plan(k: int, block_k: int, split_k: int, want: tuple[int, int]) -> None:
    per, splits = split_plan(k, block_k, split_k)
    assert (per, splits) == want
    assert per % block_k == 0 and (splits - 1) * per < k <= splits * per, (
        "a launched slice is empty or K is not covered"
    )


def test_default_config_arithmetic() -> None:
    # Llama-3.2-1B o_proj [2048, 2048]: 64 blocks of 32 columns; ceil(528 / 64) = 9 splits wanted,
    # but 2048 // 256 = 8 keeps two 128-wide tiles per split.
    assert default_config(2048, 2048, 1) == GemvConfig(32, 128, 8, 4, 4, "dot")
    # qkv [3072, 2048]: 96 blocks, ceil(528 / 96) = 6 splits.
    assert default_config(3072, 2048, 1).split_k == 6
    # LM head [128256, 2048]: 2004 blocks of 64 columns >= 528: no split.
    assert default_config(128256, 2048, 1) == GemvConfig(64, 128, 1, 4, 4, "dot")
    # gated gate_up [16384, 2048] (the table's shape is bypassed): 8192 columns -> 256 blocks of 32,
    # ceil(528 / 256) = 3 splits.
    assert default_config(16384 // 2, 2048, 1).split_k == 3


def test_tables_override_the_heuristic(monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = GemvConfig(16, 256, 2, 8, 3, "fma")
    monkeypatch.setitem(gemv.LINEAR_CONFIGS, (3072, 2048), tuned)
    assert gemv_config(3072, 2048, 1) == tuned
    assert gemv_config(3072, 2048, 1, gated=True) != tuned, "the gated kernel reads its own table"


def test_table_entries_apply_to_the_rows_they_were_tuned_for() -> None:
    """The tables hold batch-1 winners (some on the multiply-and-add path, whose accumulator grows
    with the rows): past TABLE_ROWS rows every shape takes the heuristic's config."""
    for gated, table in ((False, gemv.LINEAR_CONFIGS), (True, gemv.GATED_CONFIGS)):
        for (n, k), tuned in table.items():
            assert gemv_config(n, k, gemv.TABLE_ROWS, gated=gated) == tuned
            for rows in range(gemv.TABLE_ROWS + 1, MAX_ROWS + 1):
                expected = default_config(n // 2 if gated else n, k, rows)
                assert gemv_config(n, k, rows, gated=gated) == expected, (n, k, rows, gated)


# -- the kernels under Triton's interpreter ------------------------------------------------------

interpret = pytest.mark.interpret
needs_interpreter = pytest.mark.skipif(
    not (gemv.HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"),
    reason="runs the Triton kernels on CPU: set TRITON_INTERPRET=1 with Triton installed",
)

INTERPRET_CONFIGS = [
    GemvConfig(16, 32, 1, 4, 1, "dot"),
    GemvConfig(16, 32, 3, 4, 1, "dot"),
    GemvConfig(32, 16, 1, 4, 1, "dot_t"),
    GemvConfig(16, 64, 2, 4, 1, "dot_t"),
    GemvConfig(8, 16, 1, 4, 1, "fma"),
    GemvConfig(16, 64, 2, 4, 1, "fma"),
]


def _config_id(c: GemvConfig) -> str:
    return f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}-{c.path}"


@interpret
@needs_interpreter
@pytest.mark.parametrize("config", INTERPRET_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_kernels_under_interpreter(config: GemvConfig, dtype: torch.dtype) -> None:
    """Odd N and K (partial blocks and tiles, masked loads) and N, K that divide into whole blocks and
    tiles of every slice (unmasked loads); bias, both activations, poisoned outputs, rows 1..8."""
    for n, k in ((70, 100), (128, 256)):
        for rows in (1, 2, 5, MAX_ROWS):
            seed = 1000 * rows + config.block_n + config.split_k + n
            x, w, b = _case((rows,), n, k, dtype, seed)
            what = f"[{n}, {k}] rows {rows}"
            out = torch.full((rows, n), float("nan"), dtype=dtype)
            assert linear_triton(x, w, b, out=out, config=config) is out
            problem = violations(out, *linear_oracle(x, w, b))
            assert problem is None, f"linear {what}: {problem}"
            problem = violations(linear_triton(x, w, config=config), *linear_oracle(x, w))
            assert problem is None, f"linear without bias {what}: {problem}"
            for act in ACTS:
                out = torch.full((rows, n // 2), float("nan"), dtype=dtype)
                gated_mlp_triton(x, w, act, out=out, config=config)
                problem = violations(out, *gated_oracle(x, w, act))
                assert problem is None, f"gated {act} {what}: {problem}"


@interpret
@needs_interpreter
def test_kernel_reads_strided_leading_dims_under_interpreter() -> None:
    """x ``[2, 3, K]`` whose rows are not contiguous (every other row of a bigger tensor) and a strided
    bias, default config."""
    big, w, wide_b = _case((2, 6), 80, 48, torch.float32, 77)
    x = big[:, ::2]  # [2, 3, 48], row stride 96
    w, b = w[:40], wide_b[::2]  # bias [40], stride 2
    got = linear_triton(x, w, b)
    assert got.shape == (2, 3, 40)
    problem = violations(got, *linear_oracle(x, w, b))
    assert problem is None, problem
    got = gated_mlp_triton(x, w, "silu")
    assert got.shape == (2, 3, 20)
    problem = violations(got, *gated_oracle(x, w, "silu"))
    assert problem is None, problem


# -- the kernels compiled ahead of time for an H100 (sm_90), no GPU needed ----------------------------

H100_SHARED_MEMORY = 227 * 1024  # the most dynamic shared memory one block may opt into on sm_90


def _compile_for_sm90(config: GemvConfig, n: int, k: int, rows: int, gated: bool) -> Any:
    """Compile the GEMV kernel as a bf16 launch of this shape would (same constexprs, and the
    specialisations Triton's launcher makes: pointers 16-byte aligned, ints that are multiples of 16
    marked so, ints equal to 1 made constants) for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    n_out = n // 2 if gated else n
    per, splits = split_plan(k, config.block_k, config.split_k)
    rows_pad = 1 << (rows - 1).bit_length()
    runtime = {
        "rows": rows, "n_out": n_out, "k": k, "tiles_per_split": per // config.block_k, "up_offset": n_out if gated else 0,
        "stride_xm": k, "stride_xk": 1, "stride_om": n_out, "stride_ps": rows * n if splits > 1 else 0,
        "stride_pm": n if splits > 1 else n_out,
    }  # fmt: skip
    constexprs = {
        "ROWS_PAD": rows_pad if config.path == "fma" else max(16, rows_pad), "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k, "PATH": gemv.PATHS.index(config.path), "EVEN_N": n_out % config.block_n == 0,
        "EVEN_K": splits * per == k, "DOT_PRECISION": "tf32", "GATED": gated, "ACT": 0, "HAS_BIAS": not gated,
        "WRITE_PARTIALS": splits > 1, "USE_PDL": True,  # as an H100 launch compiles it
    }  # fmt: skip
    names = gemv._gemv_kernel.arg_names
    signature: dict[str, str] = {}
    consts: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(names):
        if name.endswith("_ptr"):
            signature[name] = "*fp32" if name == "part_ptr" else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in runtime and runtime[name] != 1:
            signature[name] = "i32"
            if runtime[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            consts[(i,)] = runtime[name] if name in runtime else constexprs[name]
    source = ASTSource(fn=gemv._gemv_kernel, signature=signature, constexprs=consts, attrs=attrs)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _sm90_cases() -> list[tuple[str, GemvConfig, int, int, int, bool]]:
    """What the dispatch may launch on the real shapes (its pick and the heuristic, rows 1 and 8),
    and every tile of the sweep on the gated gate_up shape, the one with the most shared memory."""
    cases = []
    for model, hf in REAL_SHAPE_CONFIGS.items():
        for proj, (n, k, gated) in decode_projections(ModelConfig.from_hf_dict(hf)).items():
            for rows in (1, MAX_ROWS):
                picked = gemv_config(n, k, rows, gated=gated)
                heuristic = default_config(n // 2 if gated else n, k, rows)
                for label, config in dict.fromkeys([("picked", picked), ("heuristic", heuristic)]):
                    cases.append((f"{model}/{proj} {label} rows {rows}", config, n, k, rows, gated))
    for block_n, block_k, warps, stages, path in TILES:
        config = GemvConfig(block_n, block_k, 4, warps, stages, path)
        rows = FMA_MAX_ROWS if path == "fma" else 4
        cases.append((f"sweep tile {config}", config, 16384, 2048, rows, True))
    return cases


@interpret
@pytest.mark.skipif(not gemv.HAVE_TRITON, reason="compiles the Triton kernels: needs Triton installed")
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter"
)
def test_kernels_compile_for_h100_within_shared_memory() -> None:
    """Every configuration the dispatch or the sweep may launch compiles for sm_90 (no GPU needed)
    and fits the shared memory of one H100 block."""
    for what, config, n, k, rows, gated in _sm90_cases():
        compiled = _compile_for_sm90(config, n, k, rows, gated)
        shared = compiled.metadata.shared
        assert shared <= H100_SHARED_MEMORY, f"{what}: {shared} bytes of shared memory > {H100_SHARED_MEMORY}"
