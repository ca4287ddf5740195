"""The decode matrix-vector products on the CPU: references, dispatch, checks, launch plans.

The references are checked against float64 arithmetic written out here (sums of products, the
activation formulas), the gated reference against the models' ``MLP.forward``, and the bf16/fp16
references against the rounding chain the kernels copy (``infer_ref.conformance.oracles.gemv``, whose
bound is derived in its docstring). On a CPU every dispatching call must take the reference.

Tests marked ``interpret`` run the Triton kernels themselves under Triton's CPU interpreter; they
skip unless ``TRITON_INTERPRET=1`` is set and Triton is importable:

    TRITON_INTERPRET=1 pytest -p no:cacheprovider -q tests/kernels/test_gemv.py -m interpret

One more ``interpret`` test, run when Triton is importable and ``TRITON_INTERPRET`` is not set,
compiles every launch configuration the dispatch or the sweep may use for an H100 (sm_90) without a
GPU, and checks that it fits one block's shared memory.

The fused stages (``in_norm``, ``out_norm``, ``residual``, ``weight_is_constant``) are checked the
same ways: the references against float64 arithmetic and, bit for bit, against the models' own
operations (their norm modules, ``F.linear``, ``+``); the kernels against the oracle's intervals,
which are exact (one value per element, except where the norm's rstd may round differently) for
inputs whose sums are exact in float32: integer-grid inputs, or a permutation weight, through
which the kernel's output is its normalised input itself.

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
import torch.nn.functional as F

from benchmarks.bench_gemv import FMA_MAX_ROWS, TILES, decode_projections, decode_stages
from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, TINY_CONFIGS
from infer_ref.conformance.oracles.gemv import (
    gamma,
    gated_epilogue_oracle,
    gated_oracle,
    linear_oracle,
    violations,
)
from infer_ref.fast import modules as fast_modules
from infer_ref.fast import switch
from infer_ref.fast.kernels import gemv
from infer_ref.fast.kernels.common import INTERPRETED_AS, DeviceProfile
from infer_ref.fast.kernels.gemv import (
    MAX_ROWS,
    SM90,
    GemvConfig,
    default_config,
    gated_mlp,
    gated_mlp_reference,
    gated_mlp_triton,
    gemv_config,
    linear,
    linear_reference,
    linear_triton,
    prefetched_tiles,
    split_plan,
)
from infer_ref.fast.kernels.gemv import kernel as gemv_kernel
from infer_ref.fast.kernels.gemv import launch as gemv_launch
from infer_ref.fast.kernels.gemv import op as gemv_op
from infer_ref.fast.modules import use_fast_modules
from infer_ref.fast.switch import decode_kernels, decode_kernels_enabled
from infer_ref.models.common import MLP, GemmaRMSNorm, RMSNorm
from infer_ref.norm import NormSpec

ACTS = ["silu", "gelu_pytorch_tanh"]
H100 = DeviceProfile(capability=(9, 0), sm_count=132)  # what the tables were measured on
assert INTERPRETED_AS == H100, "the interpreter plans launches as an H100 would"


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


# -- the fused stages: references and oracle -------------------------------------------------------


def _norm(d: int, dtype: torch.dtype, unit_offset: bool, seed: int, eps: float = 1e-6) -> NormSpec:
    """A norm over ``d`` as trained models have them: Llama's weights around 1 (N(1, 0.3^2)), Gemma's
    offsets around 0 (N(0, 0.5^2)), so that ignoring the weight or swapping the formulas shows."""
    w = torch.randn(d, generator=_gen(seed), dtype=torch.float64)
    return NormSpec((0.5 * w if unit_offset else 1.0 + 0.3 * w).to(dtype), eps, unit_offset)


def _residual(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A residual stream N(0, 2^2): of the outputs' order, so the add's rounding matters."""
    return (2.0 * torch.randn(*shape, generator=_gen(seed), dtype=torch.float64)).to(dtype)


FORMULAS = {"llama": False, "gemma": True}  # the norm formula: unit_offset


class Stages:
    """A set of fused stages for a linear call: the in/out norm formulas (None: none), a residual,
    a bias. ``make`` draws their tensors for a call ``[rows, K] @ [N, K]^T``."""

    def __init__(self, in_norm: str | None, out_norm: str | None, residual: bool, bias: bool) -> None:
        self.in_norm, self.out_norm, self.residual, self.bias = in_norm, out_norm, residual, bias

    def __repr__(self) -> str:
        parts = [
            f"in={self.in_norm}" if self.in_norm else "",
            f"out={self.out_norm}" if self.out_norm else "",
        ]
        parts += ["residual" if self.residual else "", "bias" if self.bias else ""]
        return "+".join(p for p in parts if p) or "plain"

    def make(self, rows: tuple[int, ...], n: int, k: int, dtype: torch.dtype, seed: int) -> dict[str, Any]:
        return {
            "bias": (
                torch.randn(n, generator=_gen(seed), dtype=torch.float64).to(dtype) if self.bias else None
            ),
            "in_norm": _norm(k, dtype, FORMULAS[self.in_norm], seed + 1) if self.in_norm else None,
            "out_norm": _norm(n, dtype, FORMULAS[self.out_norm], seed + 2) if self.out_norm else None,
            "residual": _residual((*rows, n), dtype, seed + 3) if self.residual else None,
        }


STAGE_SETS = [
    Stages("llama", None, False, False),
    Stages("gemma", None, True, True),
    Stages(None, None, True, True),
    Stages(None, "llama", True, False),
    Stages("llama", "gemma", True, True),
    Stages(None, "gemma", False, False),
]


def _written_out_norm(v: torch.Tensor, w: torch.Tensor, eps: float, unit_offset: bool) -> torch.Tensor:
    """RMSNorm over the last dim in float64, element by element: v / sqrt(mean(v^2) + eps) * weight."""
    out = torch.empty_like(v)
    for idx in range(v.shape[0]):
        row = [float(t) for t in v[idx]]
        rstd = 1.0 / math.sqrt(sum(t * t for t in row) / len(row) + eps)
        for j, t in enumerate(row):
            out[idx, j] = t * rstd * ((1.0 + float(w[j])) if unit_offset else float(w[j]))
    return out


@pytest.mark.parametrize("formulas", [("llama", "llama"), ("gemma", "gemma"), ("llama", "gemma")])
def test_staged_reference_is_the_float64_arithmetic(formulas: tuple[str, str]) -> None:
    """``residual + out_norm(in_norm(x) @ W^T + b)`` written out in float64 loops. (rms_norm computes in
    float32 whatever the input dtype, as the models' norms do: so float32's precision, not float64's.)"""
    x, w, b = _case((3,), 7, 11, torch.float64, 20)
    n_in, n_out = (
        _norm(11, torch.float64, FORMULAS[formulas[0]], 21),
        _norm(7, torch.float64, FORMULAS[formulas[1]], 22),
    )
    r = _residual((3, 7), torch.float64, 23)
    h = _written_out_norm(x, n_in.weight, n_in.eps, n_in.unit_offset)
    y = torch.empty(3, 7, dtype=torch.float64)
    for i in range(3):
        for n in range(7):
            y[i, n] = sum(float(h[i, kk]) * float(w[n, kk]) for kk in range(11)) + float(b[n])
    want = r + _written_out_norm(y, n_out.weight, n_out.eps, n_out.unit_offset)
    got = linear_reference(x, w, b, in_norm=n_in, residual=r, out_norm=n_out)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    g = (h[:, None, :] * w[None, :3, :]).sum(-1)
    u = (h[:, None, :] * w[None, 3:6, :]).sum(-1)
    torch.testing.assert_close(
        gated_mlp_reference(x, w[:6], "silu", in_norm=n_in),
        g / (1.0 + torch.exp(-g)) * u,
        rtol=1e-6,
        atol=1e-6,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("gemma", [False, True])
def test_staged_reference_is_the_models_ops_bit_for_bit(dtype: torch.dtype, gemma: bool) -> None:
    """The references compose the models' own modules: their norm (RMSNorm or GemmaRMSNorm, as the
    blocks hold them), ``F.linear`` and ``+``, bit for bit."""
    norm_cls = GemmaRMSNorm if gemma else RMSNorm
    torch.manual_seed(30)
    k, n = 48, 40
    pre, post = norm_cls(k, 1e-6), norm_cls(n, 1e-5)
    with torch.no_grad():
        for norm in (pre, post):
            norm.weight.copy_(_norm(norm.weight.shape[0], torch.float64, gemma, 31).weight)
    pre, post = pre.to(dtype), post.to(dtype)
    x, w, b = _case((2, 3), n, k, dtype, 32)
    r = _residual((2, 3, n), dtype, 33)
    with torch.no_grad():
        want = r + post(F.linear(pre(x), w, b))
        got = linear_reference(x, w, b, in_norm=pre.spec, residual=r, out_norm=post.spec)
        assert _bits(got).equal(_bits(want))
        assert _bits(linear_reference(x, w, in_norm=pre.spec)).equal(_bits(F.linear(pre(x), w)))
        assert _bits(linear_reference(x, w, residual=r)).equal(_bits(r + F.linear(x, w)))
        g, u = F.linear(pre(x), w).split(n // 2, dim=-1)
        act = gemv.ACTIVATIONS["gelu_pytorch_tanh" if gemma else "silu"]
        got = gated_mlp_reference(x, w, "gelu_pytorch_tanh" if gemma else "silu", in_norm=pre.spec)
        assert _bits(got).equal(_bits(act(g) * u))


def _model_block_classes() -> tuple[type, type] | None:
    """The models' projection modules taking fused stages, where this checkout has them."""
    linear_cls, normed_cls = (
        getattr(fast_modules, "KernelLinear", None),
        getattr(fast_modules, "Normed", None),
    )
    return None if linear_cls is None or normed_cls is None else (linear_cls, normed_cls)


@pytest.mark.skipif(
    _model_block_classes() is None, reason="the models do not fold stages into projections here"
)
@pytest.mark.parametrize("gemma", [False, True])
def test_models_projection_with_kernels_switched_on_is_its_eager_path(gemma: bool) -> None:
    """A model projection with the decode kernels switched on calls ``gemv.linear`` with its stages
    (on a CPU: the reference); switched off it runs its own eager ops. The two agree bit for bit."""
    classes = _model_block_classes()
    assert classes is not None
    decode_linear, normed = classes
    norm_cls = GemmaRMSNorm if gemma else RMSNorm
    torch.manual_seed(34)
    proj, pre, post = decode_linear(24, 16, bias=False), norm_cls(24, 1e-6), norm_cls(16, 1e-6)
    x, r = torch.randn(2, 1, 24).to(torch.bfloat16), torch.randn(2, 1, 16).to(torch.bfloat16)
    proj, pre, post = proj.to(torch.bfloat16), pre.to(torch.bfloat16), post.to(torch.bfloat16)
    with torch.no_grad():
        eager = proj(normed(pre, x), residual=r, out_norm=post)
        with decode_kernels():
            fused = proj(normed(pre, x), residual=r, out_norm=post)
        want = linear_reference(x, proj.weight, in_norm=pre.spec, residual=r, out_norm=post.spec)
    assert _bits(eager).equal(_bits(want)) and _bits(fused).equal(_bits(want))


def test_every_activation_has_a_kernel_code() -> None:
    assert set(gemv_kernel.ACT_CODES) == set(gemv.ACTIVATIONS)
    assert len(set(gemv_kernel.ACT_CODES.values())) == len(gemv_kernel.ACT_CODES)


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_decode_stages_are_what_the_models_blocks_ask_for(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decode_stages`` (what the benchmarks sweep and the docs state) against the calls a model
    really makes with the decode kernels on: each projection's stages recorded from one decode step."""
    from infer_ref.cache.static import StaticKVCache
    from infer_ref.models import build_model

    config = ModelConfig.from_hf_dict(TINY_CONFIGS[family])
    model = use_fast_modules(build_model(config).eval())
    model.reset_buffers("cpu")
    seen: dict[tuple[int, int, bool], set[tuple[bool, bool, bool, bool]]] = {}

    def record(weight: torch.Tensor, gated: bool, in_norm: Any, residual: Any = None, out_norm: Any = None) -> None:
        offsets = {spec.unit_offset for spec in (in_norm, out_norm) if spec is not None}
        key = (weight.shape[0], weight.shape[1], gated)
        seen.setdefault(key, set()).add((in_norm is not None, residual is not None, out_norm is not None, offsets == {True}))

    real_linear, real_gated = gemv.linear, gemv.gated_mlp

    def linear(x, weight, bias=None, **kw):  # type: ignore[no-untyped-def]
        record(weight, False, kw.get("in_norm"), kw.get("residual"), kw.get("out_norm"))
        return real_linear(x, weight, bias, **kw)

    def gated(x, weight, act, **kw):  # type: ignore[no-untyped-def]
        record(weight, True, kw.get("in_norm"))
        return real_gated(x, weight, act, **kw)

    monkeypatch.setattr(gemv, "linear", linear)
    monkeypatch.setattr(gemv, "gated_mlp", gated)
    cache = StaticKVCache.from_model_config(config, 8, dtype=torch.float32, device="cpu")
    with torch.inference_mode(), switch.decode_kernels():
        model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
        model(torch.tensor([[4]]), kv_cache=cache)
    gemma = config.model_type == "gemma3_text"
    stages = decode_stages(config)
    assert set(stages) == set(decode_projections(config))
    wanted: dict[tuple[int, int, bool], set[tuple[bool, bool, bool, bool]]] = {}
    for proj, (n, k, is_gated) in decode_projections(config).items():  # shapes may coincide in a tiny model
        st = stages[proj]
        want = (st.in_norm, st.residual, st.out_norm, st.unit_offset and (st.in_norm or st.out_norm))
        if proj == "lm_head":  # the final norm is the model's own: the LM head is a plain product
            assert want == (False, False, False, False)
        wanted.setdefault((n, k, is_gated), set()).add(want)
    assert seen == wanted, f"{family}: the model asks for {seen}, decode_stages says {wanted}"
    for st in stages.values():
        assert st.unit_offset == gemma or not (st.in_norm or st.out_norm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("stages", STAGE_SETS, ids=repr)
def test_staged_references_meet_the_oracle(dtype: torch.dtype, stages: Stages) -> None:
    """Eager torch rounds where the kernels round: the references meet the oracle's bound, with
    random inputs (the float32 accumulation bound) and with exact sums (the tight intervals)."""
    for seed in range(3):
        x, w, _ = _case((4,), 96, 200, dtype, 40 + seed)
        kw = stages.make((4,), 96, 200, dtype, 50 + 10 * seed)
        problem = violations(linear_reference(x, w, **kw), *linear_oracle(x, w, **kw))
        assert problem is None, f"seed {seed}: {problem}"
        xe, we, be = _exact_case(4, 96, 200, dtype, 60 + seed)
        kw["bias"] = be if stages.bias else None
        kw["in_norm"] = None  # an in_norm breaks exact sums: see the permutation test below
        problem = violations(linear_reference(xe, we, **kw), *linear_oracle(xe, we, **kw, sums_exact=True))
        assert problem is None, f"exact sums, seed {seed}: {problem}"
    if stages.in_norm is not None:
        for act in ACTS:
            x, w, _ = _case((4,), 96, 200, dtype, 70)
            kw = stages.make((4,), 96, 200, dtype, 71)
            got = gated_mlp_reference(x, w, act, in_norm=kw["in_norm"])
            problem = violations(got, *gated_oracle(x, w, act, in_norm=kw["in_norm"]))
            assert problem is None, f"gated {act}: {problem}"


def _exact_case(
    rows: int, n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs whose products and sums are exact in float32: x in {-1, 0, 1}; weights and bias
    ``j / 1024``, ``|j| <= 512``: every partial sum is a multiple of 2**-10 below ``K / 2 + 1/2``
    (2**18 steps for K <= 512), so any order gives the exact value and only the roundings to the
    dtype remain (sums of order 5 need ~13 bits: more than fp16's 11, so those do round)."""
    g = _gen(seed)
    x = torch.randint(-1, 2, (rows, k), generator=g).to(dtype)
    w = (torch.randint(-512, 513, (n, k), generator=g) / 1024).to(dtype)
    b = (torch.randint(-512, 513, (n,), generator=g) / 1024).to(dtype)
    return x, w, b


def _permutation(n: int, k: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n, k]`` with one 1 per row at a random column (distinct columns when n <= k): through it the
    product of a normalised x is that x's elements themselves, every float32 sum exact."""
    cols = (
        torch.randperm(k, generator=_gen(seed))[:n]
        if n <= k
        else torch.randint(0, k, (n,), generator=_gen(seed))
    )
    w = torch.zeros(n, k, dtype=dtype)
    w[torch.arange(n), cols] = 1.0
    return w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("formula", sorted(FORMULAS))
def test_in_norm_oracle_is_tight_through_a_permutation(dtype: torch.dtype, formula: str) -> None:
    """Through a permutation weight the reference's output is rms_norm(x) itself: the oracle allows it
    and, for all but a small fraction of the elements, nothing else (a range of one value), so a
    kernel that rounds its normalised input differently is caught. The fraction with two values:
    where ``t``'s range (rstd's relative error ``rho``, about ``gamma(K)/2``) straddles a rounding
    boundary, at most ``4 rho / eps`` of them (the dtype's relative spacing is ``eps/2 .. eps``)."""
    k = 2048
    x = torch.randn(3, k, generator=_gen(80), dtype=torch.float64).to(dtype)
    w = _permutation(k, k, 81, dtype)
    norm = _norm(k, dtype, FORMULAS[formula], 82)
    got = linear_reference(x, w, in_norm=norm)
    want, bound = linear_oracle(x, w, in_norm=norm, sums_exact=True)
    assert violations(got, want, bound) is None
    rho = gamma(k + 4) / 2 + 12 * 2.0**-24
    loose = (bound > 0).float().mean().item()
    assert loose <= 4 * rho / torch.finfo(dtype).eps, (
        f"{loose:.4f} of the elements have a range of two values"
    )
    tight = (bound == 0).nonzero()[0].tolist()
    wrong = got.clone()
    wrong[tight[0], tight[1]] = (got[tight[0], tight[1]].double() * (1 + torch.finfo(dtype).eps)).to(dtype)
    assert violations(wrong, want, bound) is not None, "one ulp off a one-value range passed"


def test_staged_oracle_catches_the_plausible_bugs() -> None:
    """Each of these gives an output the oracle refuses (bf16, the random inputs the kernel tests
    use): the norm weight ignored, rstd from half of K, Gemma's formula for Llama's, the residual
    added to the unrounded product (exact sums), the out_norm over half of the row."""
    dtype, rows, n, k = torch.bfloat16, 2, 64, 256
    x, w, b = _case((rows,), n, k, dtype, 90)
    llama, gemma = _norm(k, dtype, False, 91), _norm(k, dtype, True, 92)
    r = _residual((rows, n), dtype, 93)

    def caught(got: torch.Tensor, **kw: Any) -> bool:
        return violations(got.to(dtype), *linear_oracle(x, w, **kw)) is not None

    assert caught(F.linear(NormSpec(torch.ones_like(llama.weight), llama.eps)(x), w), in_norm=llama)
    half_rstd = (x[:, : k // 2].float().pow(2).mean(-1, keepdim=True) + llama.eps).rsqrt()
    assert caught(F.linear(llama.weight * (x.float() * half_rstd).to(dtype), w), in_norm=llama)
    assert caught(F.linear(NormSpec(llama.weight, llama.eps, True)(x), w), in_norm=llama)
    assert caught(F.linear(NormSpec(gemma.weight, gemma.eps, False)(x), w), in_norm=gemma)
    out_norm = _norm(n, dtype, True, 94)
    y = F.linear(x, w, b)
    halves = torch.cat(
        [
            NormSpec(out_norm.weight[:32], 1e-6, True)(y[:, :32]),
            NormSpec(out_norm.weight[32:], 1e-6, True)(y[:, 32:]),
        ],
        -1,
    )
    assert caught(halves, bias=b, out_norm=out_norm)
    xe, we, be = _exact_case(rows, n, k, dtype, 95)
    unrounded = (r.float() + F.linear(xe.float(), we.float(), be.float())).to(dtype)
    assert violations(unrounded, *linear_oracle(xe, we, be, residual=r, sums_exact=True)) is not None
    assert (
        violations(r + F.linear(xe, we, be), *linear_oracle(xe, we, be, residual=r, sums_exact=True)) is None
    )


# -- dispatch --------------------------------------------------------------------------------------


def _forbid_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("the kernel path was taken")

    monkeypatch.setattr(gemv_op, "linear_triton", boom)
    monkeypatch.setattr(gemv_op, "gated_mlp_triton", boom)


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


@pytest.mark.parametrize("stages", STAGE_SETS, ids=repr)
def test_staged_cpu_calls_take_the_reference(monkeypatch: pytest.MonkeyPatch, stages: Stages) -> None:
    _forbid_kernels(monkeypatch)
    x, w, _ = _case((2, 1), 12, 16, torch.bfloat16, 8)
    kw = stages.make((2, 1), 12, 16, torch.bfloat16, 9)
    with decode_kernels():
        for constant in (False, True):
            got = linear(x, w, **kw, weight_is_constant=constant)
            assert _bits(got).equal(_bits(linear_reference(x, w, **kw)))
            out = torch.full((2, 1, 12), float("nan"), dtype=torch.bfloat16)
            assert linear(x, w, **kw, out=out, weight_is_constant=constant) is out
            assert _bits(out).equal(_bits(got))
        if kw["in_norm"] is not None:
            got = gated_mlp(x, w, "silu", in_norm=kw["in_norm"], weight_is_constant=True)
            assert _bits(got).equal(_bits(gated_mlp_reference(x, w, "silu", in_norm=kw["in_norm"])))


def test_residual_may_be_out_itself() -> None:
    """``out`` may be the residual (an in-place residual update): the result is computed from the
    residual's values before the call."""
    x, w, b = _case((3,), 12, 16, torch.float32, 10)
    stream = _residual((3, 12), torch.float32, 11)
    want = linear_reference(x, w, b, residual=stream.clone(), out_norm=_norm(12, torch.float32, True, 12))
    assert linear(x, w, b, residual=stream, out=stream, out_norm=_norm(12, torch.float32, True, 12)) is stream
    assert torch.equal(stream, want)


class _Recorder:
    """Stands in for a kernel entry point: records its arguments, returns the reference's result."""

    def __init__(self, reference: Callable[..., torch.Tensor]) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.reference = reference

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls.append((args, kwargs))
        kwargs = {
            k: v for k, v in kwargs.items() if k not in ("weight_is_constant", "residual_is_settled", "config", "out")
        }
        return self.reference(*args, **kwargs)


def test_dispatch_passes_the_stages_through_the_custom_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel applies (forced here on a CPU), the call goes through the custom op, which
    flattens each NormSpec to (weight, eps, unit_offset) and rebuilds it for the kernel entry point.
    A CUBLAS_SHAPES weight keeps F.linear for a plain product but takes the kernel with an in_norm
    (the norm is then in the kernel's prologue)."""
    lin, gated = _Recorder(linear_reference), _Recorder(gated_mlp_reference)
    monkeypatch.setattr(gemv_op, "linear_triton", lin)
    monkeypatch.setattr(gemv_op, "gated_mlp_triton", gated)
    monkeypatch.setattr(gemv_op, "_kernel_eligible", lambda x, w: True)
    x, w, b = _case((1,), 12, 16, torch.float32, 13)
    n_in, n_out, r = (
        _norm(16, torch.float32, False, 14, eps=1e-5),
        _norm(12, torch.float32, True, 15),
        _residual((1, 12), torch.float32, 16),
    )
    got = linear(
        x, w, b, in_norm=n_in, residual=r, out_norm=n_out, weight_is_constant=True, residual_is_settled=True
    )
    assert torch.equal(got, linear_reference(x, w, b, in_norm=n_in, residual=r, out_norm=n_out))
    ((args, kwargs),) = lin.calls
    assert (
        args[0] is x
        and args[1] is w
        and args[2] is b
        and kwargs["residual"] is r
        and kwargs["weight_is_constant"] is True
        and kwargs["residual_is_settled"] is True
    )
    assert kwargs["in_norm"] == n_in and kwargs["out_norm"] == n_out, "a norm lost its weight, eps or formula"
    gated_mlp(x, w, "silu", in_norm=n_in, weight_is_constant=True)
    ((args, kwargs),) = gated.calls
    assert kwargs["in_norm"] == n_in and kwargs["weight_is_constant"] is True
    kept = sorted(gemv.CUBLAS_SHAPES)[0]
    xk, wk, _ = _case((1,), kept[0], kept[1], torch.float32, 17)
    lin.calls.clear()
    linear(xk, wk)
    assert lin.calls == [], "a plain product of a CUBLAS_SHAPES weight took the kernel"
    linear(xk, wk, in_norm=_norm(kept[1], torch.float32, False, 18))
    assert len(lin.calls) == 1, "a CUBLAS_SHAPES weight with an in_norm did not take the kernel"


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
R = _residual((1, 8), torch.float32, 8)
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
    good_in, good_out = NormSpec(torch.ones(16), 1e-6), NormSpec(torch.ones(8), 1e-6)
    for name, fn in (("linear", linear), ("linear_triton", linear_triton)):
        calls += [
            (
                f"{name}-in-norm-type",
                lambda fn=fn: fn(X, W, in_norm=torch.ones(16)),
                TypeError,
                "in_norm must be a NormSpec or None, got Tensor",
            ),
            (
                f"{name}-in-norm-shape",
                lambda fn=fn: fn(X, W, in_norm=good_out),
                ValueError,
                "in_norm.weight must be [K=16], got (8,)",
            ),
            (
                f"{name}-in-norm-dtype",
                lambda fn=fn: fn(X, W, in_norm=NormSpec(torch.ones(16).half(), 1e-6)),
                TypeError,
                "in_norm.weight has dtype torch.float16, x has torch.float32",
            ),
            (
                f"{name}-in-norm-device",
                lambda fn=fn: fn(X, W, in_norm=NormSpec(torch.ones(16, device="meta"), 1e-6)),
                ValueError,
                "in_norm.weight is on meta",
            ),
            (
                f"{name}-out-norm-shape",
                lambda fn=fn: fn(X, W, out_norm=good_in),
                ValueError,
                "out_norm.weight must be [N=8], got (16,)",
            ),
            (
                f"{name}-out-norm-type",
                lambda fn=fn: fn(X, W, out_norm=(torch.ones(8), 1e-6)),
                TypeError,
                "out_norm must be a NormSpec or None, got tuple",
            ),
            (
                f"{name}-out-norm-dtype",
                lambda fn=fn: fn(X, W, out_norm=NormSpec(torch.ones(8).double(), 1e-6)),
                TypeError,
                "out_norm.weight has dtype torch.float64",
            ),
            (
                f"{name}-residual-shape",
                lambda fn=fn: fn(X, W, residual=torch.zeros(1, 16)),
                ValueError,
                "residual must be (1, 8) (x's leading dims, then N), got (1, 16)",
            ),
            (
                f"{name}-residual-rows",
                lambda fn=fn: fn(X, W, residual=torch.zeros(8)),
                ValueError,
                "residual must be (1, 8)",
            ),
            (
                f"{name}-residual-dtype",
                lambda fn=fn: fn(X, W, residual=torch.zeros(1, 8).half()),
                TypeError,
                "residual has dtype torch.float16, x has torch.float32",
            ),
            (
                f"{name}-residual-device",
                lambda fn=fn: fn(X, W, residual=torch.zeros(1, 8, device="meta")),
                ValueError,
                "residual is on meta",
            ),
            (
                f"{name}-residual-type",
                lambda fn=fn: fn(X, W, residual=0.5),
                TypeError,
                "residual must be a tensor or None, got float",
            ),
            (
                f"{name}-constant-flag",
                lambda fn=fn: fn(X, W, weight_is_constant=1),
                TypeError,
                "weight_is_constant must be a bool, got 1",
            ),
            (
                f"{name}-settled-flag",
                lambda fn=fn: fn(X, W, residual=R, residual_is_settled="yes"),
                TypeError,
                "residual_is_settled must be a bool, got 'yes'",
            ),
            (
                f"{name}-settled-without-residual",
                lambda fn=fn: fn(X, W, residual_is_settled=True),
                ValueError,
                "residual_is_settled=True is a promise about the residual, but no residual was given",
            ),
        ]
    for name, fn in (("gated_mlp", gated_mlp), ("gated_mlp_triton", gated_mlp_triton)):
        calls += [
            (
                f"{name}-in-norm-shape",
                lambda fn=fn: fn(X, W_GATED, "silu", in_norm=good_out),
                ValueError,
                "in_norm.weight must be [K=16], got (8,)",
            ),
            (
                f"{name}-in-norm-type",
                lambda fn=fn: fn(X, W_GATED, "silu", in_norm="rms"),
                TypeError,
                "in_norm must be a NormSpec or None, got str",
            ),
            (
                f"{name}-constant-flag",
                lambda fn=fn: fn(X, W_GATED, "silu", weight_is_constant=None),
                TypeError,
                "weight_is_constant must be a bool, got None",
            ),
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


def _bad_staged_outs() -> list[
    tuple[str, Callable[[], tuple[torch.Tensor, dict[str, Any]]], type[Exception], str]
]:
    """``(out, stage arguments)`` that the linear entry points refuse; a good out is ``[1, 8]`` float32."""

    def storage() -> torch.Tensor:
        return torch.full((9,), float("nan"))

    def shifted() -> tuple[torch.Tensor, dict[str, Any]]:
        s = storage()  # the residual is out's memory one element on: overlapping, not the same view
        return s[:8].view(1, 8), {"residual": s[1:].view(1, 8)}

    def out_norm_is_out() -> tuple[torch.Tensor, dict[str, Any]]:
        out = storage()[:8].view(1, 8)
        return out, {"out_norm": NormSpec(out[0], 1e-6)}

    def bias_is_out() -> tuple[torch.Tensor, dict[str, Any]]:
        out = storage()[:8].view(1, 8)
        return out, {"bias": out[0]}

    def in_norm_in_out() -> tuple[torch.Tensor, dict[str, Any]]:
        s = torch.full((16,), float("nan"))
        return s[:8].view(1, 8), {"in_norm": NormSpec(s, 1e-6)}

    def residual_dtype() -> tuple[torch.Tensor, dict[str, Any]]:
        return storage()[:8].view(1, 8), {"residual": torch.zeros(1, 8, dtype=torch.float16)}

    return [
        ("residual-overlaps-out", shifted, ValueError, "residual overlaps out without being the same view"),
        ("out-norm-weight-is-out", out_norm_is_out, ValueError, "out shares memory with out_norm.weight"),
        ("bias-is-out", bias_is_out, ValueError, "out shares memory with bias"),
        ("in-norm-weight-holds-out", in_norm_in_out, ValueError, "out shares memory with in_norm.weight"),
        ("residual-dtype", residual_dtype, TypeError, "residual has dtype torch.float16"),
    ]


BAD_STAGED_OUTS = _bad_staged_outs()


@pytest.mark.parametrize("entry", ["linear", "linear_triton"])
@pytest.mark.parametrize(
    ("make", "exc", "fragment"), [c[1:] for c in BAD_STAGED_OUTS], ids=[c[0] for c in BAD_STAGED_OUTS]
)
def test_bad_stage_is_named_and_out_untouched(
    entry: str, make: Callable[[], tuple[torch.Tensor, dict[str, Any]]], exc: type[Exception], fragment: str
) -> None:
    out, kwargs = make()
    before = out.clone()
    with pytest.raises(exc, match=re.escape(fragment)):
        ENTRIES[entry](X, W, out=out, **kwargs)
    assert _bits(out).equal(_bits(before)), "a rejected call wrote into out"


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
        ({"block_n": 32, "block_k": 64, "prefetch_tiles": 0}, "prefetch_tiles must be an int in [1, 2]"),
        ({"block_n": 32, "block_k": 64, "prefetch_tiles": 3}, "prefetch_tiles must be an int in [1, 2]"),
        ({"block_n": 32, "block_k": 64, "prefetch_tiles": 2.0}, "prefetch_tiles must be an int in [1, 2]"),
        ({"block_n": 32, "block_k": 64, "prefetch_tiles": True}, "prefetch_tiles must be an int in [1, 2]"),
        ({"block_n": 32, "block_k": 64, "weight_first": 1}, "weight_first must be a bool, got 1"),
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
    # An H100's 132 SMs: 4 * 132 = 528 programs wanted.
    # Llama-3.2-1B o_proj [2048, 2048]: 64 blocks of 32 columns; ceil(528 / 64) = 9 splits wanted,
    # but 2048 // 256 = 8 keeps two 128-wide tiles per split.
    assert default_config(2048, 2048, 1, device=H100) == GemvConfig(32, 128, 8, 4, 4, "dot")
    # qkv [3072, 2048]: 96 blocks, ceil(528 / 96) = 6 splits.
    assert default_config(3072, 2048, 1, device=H100).split_k == 6
    # LM head [128256, 2048]: 2004 blocks of 64 columns >= 528: no split.
    assert default_config(128256, 2048, 1, device=H100) == GemvConfig(64, 128, 1, 4, 4, "dot")
    # gated gate_up [16384, 2048] (the table's shape is bypassed): 8192 columns -> 256 blocks of 32,
    # ceil(528 / 256) = 3 splits.
    assert default_config(16384 // 2, 2048, 1, device=H100).split_k == 3


def test_default_config_fills_the_device_it_is_asked_about() -> None:
    """The heuristic's program target is four per SM of the device: on 66 SMs (264 programs) Llama's
    qkv [3072, 2048] (96 blocks of 32) wants ceil(264 / 96) = 3 splits instead of 6; the LM head
    [128256, 2048] takes 64-column blocks as soon as 2004 >= 4 * SMs, but 32-column ones on 600 SMs."""
    small = DeviceProfile(capability=(8, 0), sm_count=66)
    assert default_config(3072, 2048, 1, device=small).split_k == 3
    assert default_config(128256, 2048, 1, device=small).block_n == 64
    assert default_config(128256, 2048, 1, device=DeviceProfile((9, 0), 600)).block_n == 32


def test_tables_override_the_heuristic(monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = GemvConfig(16, 256, 2, 8, 3, "fma")
    monkeypatch.setitem(gemv.LINEAR_CONFIGS, (SM90, (3072, 2048)), tuned)
    assert gemv_config(3072, 2048, 1, device=H100) == tuned
    assert gemv_config(3072, 2048, 1, gated=True, device=H100) != tuned, "the gated kernel reads its own table"
    other = DeviceProfile(capability=(8, 0), sm_count=132)
    assert gemv_config(3072, 2048, 1, device=other) != tuned, "another device read the sm_90 table"


def test_table_entries_apply_to_the_rows_they_were_tuned_for() -> None:
    """The tables hold batch-1 winners (some on the multiply-and-add path, whose accumulator grows
    with the rows): past TABLE_ROWS rows every shape takes the heuristic's config."""
    for gated, table in ((False, gemv.LINEAR_CONFIGS), (True, gemv.GATED_CONFIGS)):
        for (capability, (n, k)), tuned in table.items():
            device = DeviceProfile(capability, 132)
            assert gemv_config(n, k, gemv.TABLE_ROWS, gated=gated, device=device) == tuned
            for rows in range(gemv.TABLE_ROWS + 1, MAX_ROWS + 1):
                expected = default_config(n // 2 if gated else n, k, rows, device=device)
                assert gemv_config(n, k, rows, gated=gated, device=device) == expected, (n, k, rows, gated)


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
    # Two weight tiles before the wait: slices of several tiles (the loop runs after them), of two,
    # and of one (K = 100 in 64-wide tiles, 2 splits: the host caps the prefetch at one tile).
    GemvConfig(16, 16, 1, 4, 1, "dot", prefetch_tiles=2),
    GemvConfig(16, 32, 2, 4, 1, "dot_t", prefetch_tiles=2),
    GemvConfig(8, 64, 2, 4, 1, "fma", prefetch_tiles=2),
    # The K loop loading each weight tile before the x tile.
    GemvConfig(16, 16, 3, 4, 1, "dot", weight_first=True),
    GemvConfig(4, 16, 1, 4, 1, "fma", weight_first=True),
]


def _config_id(c: GemvConfig) -> str:
    return f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}-{c.path}-p{c.prefetch_tiles}{'-wf' if c.weight_first else ''}"


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


@interpret
@needs_interpreter
@pytest.mark.parametrize("config", INTERPRET_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fused_stages_under_interpreter(config: GemvConfig, dtype: torch.dtype) -> None:
    """Every stage set (in_norm of either formula, out_norm of either, residual, bias, together and
    apart) on every path, unsplit and split (with a split, the residual is the combine's; an
    out_norm always is), odd and whole shapes, rows 1..8, weight_is_constant and residual_is_settled
    on and off, poisoned outputs; the gated kernel with an in_norm of either formula. Against the oracle's bound."""
    for n, k, row_counts in ((70, 100, (1, 3, MAX_ROWS)), (128, 256, (2,))):
        for rows in row_counts:
            for i, stages in enumerate(STAGE_SETS):
                constant = (i + rows) % 2 == 0
                seed = 100 * rows + 10 * i + config.split_k + n
                x, w, _ = _case((rows,), n, k, dtype, seed)
                kw = stages.make((rows,), n, k, dtype, seed)
                # The residual read before the dependency wait (the models' calls) on every other call.
                settled = kw.get("residual") is not None and (i + rows) % 4 < 2
                out = torch.full((rows, n), float("nan"), dtype=dtype)
                got = linear_triton(
                    x, w, **kw, out=out, weight_is_constant=constant, residual_is_settled=settled, config=config
                )
                assert got is out
                problem = violations(out, *linear_oracle(x, w, **kw))
                assert problem is None, f"[{n}, {k}] rows {rows} {stages} constant={constant} settled={settled}: {problem}"
            for j, (act, formula) in enumerate((("silu", "llama"), ("gelu_pytorch_tanh", "gemma"))):
                x, w, _ = _case((rows,), n, k, dtype, 7 * rows + j)
                norm = _norm(k, dtype, FORMULAS[formula], 7 * rows + j)
                out = torch.full((rows, n // 2), float("nan"), dtype=dtype)
                gated_mlp_triton(
                    x, w, act, out=out, in_norm=norm, weight_is_constant=(j + rows) % 2 == 1, config=config
                )
                problem = violations(out, *gated_oracle(x, w, act, in_norm=norm))
                assert problem is None, f"gated {act} in_norm={formula} [{n}, {k}] rows {rows}: {problem}"


EXACT_CONFIGS = [
    GemvConfig(16, 32, 1, 4, 1, "dot"),
    GemvConfig(32, 16, 3, 4, 1, "dot_t"),
    GemvConfig(8, 32, 1, 4, 1, "fma"),
    GemvConfig(16, 32, 4, 4, 1, "fma"),
]


@interpret
@needs_interpreter
@pytest.mark.parametrize("config", EXACT_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("formula", sorted(FORMULAS))
def test_in_norm_rounds_like_rms_norm_under_interpreter(config: GemvConfig, formula: str) -> None:
    """Through a permutation weight the linear kernel's output is its normalised input itself, every
    sum exact: it must equal rms_norm(x) exactly wherever the oracle's range is one value (and the
    reference there), so each rounding of the prologue is checked, over all of K (the permutation
    crosses the K slices). The gated kernel with two permutations: gate and up are normalised x."""
    dtype, k = torch.float16, 200
    for rows in (1, 3):
        for constant in (False, True):
            x = torch.randn(rows, k, generator=_gen(rows), dtype=torch.float64).to(dtype)
            norm = _norm(k, dtype, FORMULAS[formula], 10 + rows)
            w = _permutation(k, k, 20 + rows, dtype)
            got = linear_triton(x, w, in_norm=norm, weight_is_constant=constant, config=config)
            want, bound = linear_oracle(x, w, in_norm=norm, sums_exact=True)
            assert violations(got, want, bound) is None, (
                f"rows {rows} constant={constant}: {violations(got, want, bound)}"
            )
            ref = linear_reference(x, w, in_norm=norm)
            assert _bits(got[bound == 0]).equal(_bits(ref[bound == 0])), (
                "differs from rms_norm where the oracle is exact"
            )
            wg = torch.cat([_permutation(k, k, 30 + rows, dtype), _permutation(k, k, 40 + rows, dtype)])
            got = gated_mlp_triton(x, wg, "silu", in_norm=norm, weight_is_constant=constant, config=config)
            problem = violations(got, *gated_oracle(x, wg, "silu", in_norm=norm, sums_exact=True))
            assert problem is None, f"gated rows {rows}: {problem}"


@interpret
@needs_interpreter
@pytest.mark.parametrize("config", EXACT_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_exact_sums_round_like_eager_under_interpreter(config: GemvConfig, dtype: torch.dtype) -> None:
    """With sums exact in float32 the kernel's product is round(exact), so the epilogue is checked
    alone: ``round(r32 + round(y))`` bit for bit against eager's ``r + y`` (a residual added before
    rounding y differs), the out_norm (of either formula) exactly wherever the oracle's range is
    one value, and the gated epilogue's roundings against eager's ops."""
    n, k = 96, 200
    for rows in (1, 4):
        x, w, b = _exact_case(rows, n, k, dtype, 50 + rows)
        r = _residual((rows, n), dtype, 60 + rows)
        exact = x.double() @ w.double().T + b.double()  # exact: float64 holds every partial sum
        got = linear_triton(
            x, w, b, residual=r, weight_is_constant=rows == 1, residual_is_settled=rows == 1, config=config
        )
        want = r + exact.to(dtype)  # eager: the rounded product plus the residual, rounded
        assert _bits(got).equal(_bits(want)), (
            f"rows {rows}: {int((got != want).sum())} elements differ from r + round(y)"
        )
        for formula, unit_offset in FORMULAS.items():
            norm = _norm(n, dtype, unit_offset, 70 + rows)
            got = linear_triton(x, w, b, residual=r, out_norm=norm, config=config)
            want, bound = linear_oracle(x, w, b, residual=r, out_norm=norm, sums_exact=True)
            problem = violations(got, want, bound)
            assert problem is None, f"out_norm {formula} rows {rows}: {problem}"
            ref = linear_reference(x, w, b, residual=r, out_norm=norm)
            assert _bits(got[bound == 0]).equal(_bits(ref[bound == 0])), (
                f"out_norm {formula}: differs from eager"
            )
        # The gated epilogue on exact sums: act(round g) rounded, times round u, rounded. Eager's ops
        # compute exp/tanh with other float32 implementations, so in float16 an activation within a
        # few float32 ulps of a rounding midpoint may round one ulp apart: at most 1% of the elements
        # may differ (where 1 + tanh(y) < 1/64 eager's gelu has cancelled: only the oracle's bound
        # there). A skipped rounding of g or of the activation differs in a large fraction. (In
        # float32 those implementations differ in most last bits: only the oracle's bound applies.)
        g64, u64 = exact[:, : n // 2] - b.double()[: n // 2], exact[:, n // 2 :] - b.double()[n // 2 :]
        for act in ACTS:
            got = gated_mlp_triton(x, w, act, config=config)
            zeros = torch.zeros_like(g64)
            assert violations(got, *gated_epilogue_oracle(g64, u64, act, dtype, zeros, zeros)) is None, act
            if dtype == torch.float32:
                continue
            g, u = g64.to(dtype), u64.to(dtype)
            eager = gemv.ACTIVATIONS[act](g) * u
            compared = torch.ones_like(got, dtype=torch.bool)
            if act == "gelu_pytorch_tanh":
                gd = g.double()
                compared = 1.0 + torch.tanh(math.sqrt(2 / math.pi) * (gd + 0.044715 * gd**3)) >= 1 / 64
            differ = (got != eager) & compared
            assert differ.sum() <= 0.01 * compared.sum(), (
                f"gated {act}: {int(differ.sum())} elements differ from eager"
            )


@interpret
@needs_interpreter
def test_out_norm_over_a_row_wider_than_its_block_under_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row wider than OUT_NORM_BLOCK is walked twice (the squares, then the normalised values): the
    norm is still over the whole row. Exact sums, so the check is exact where the oracle's range is
    one value; a mean square over one block would be off everywhere."""
    monkeypatch.setattr(gemv_launch, "OUT_NORM_BLOCK", 32)
    n, k = 70, 64  # blocks of 32, 32 and 6 columns
    for config in (GemvConfig(16, 32, 1, 4, 1, "dot"), GemvConfig(8, 16, 2, 4, 1, "fma")):
        for unit_offset in (False, True):
            x, w, b = _exact_case(2, n, k, torch.float16, 80)
            r = _residual((2, n), torch.float16, 81)
            norm = _norm(n, torch.float16, unit_offset, 82)
            got = linear_triton(x, w, b, residual=r, out_norm=norm, config=config)
            want, bound = linear_oracle(x, w, b, residual=r, out_norm=norm, sums_exact=True)
            assert violations(got, want, bound) is None, (
                f"{config} unit_offset={unit_offset}: {violations(got, want, bound)}"
            )
            assert (bound == 0).float().mean() > 0.9


@interpret
@needs_interpreter
def test_in_place_residual_and_strided_inputs_under_interpreter() -> None:
    """``out`` is the residual itself (in-place update, one split and split); x, the residual and the
    norm weight are strided views (every other row or element of bigger tensors)."""
    for config in (GemvConfig(16, 32, 1, 4, 1, "dot"), GemvConfig(8, 16, 3, 4, 1, "fma")):
        for out_norm in (None, _norm(40, torch.float32, True, 90)):
            x, w, b = _case((3,), 40, 48, torch.float32, 91)
            stream = _residual((3, 40), torch.float32, 92)
            want, bound = linear_oracle(x, w, b, residual=stream.clone(), out_norm=out_norm)
            assert (
                linear_triton(x, w, b, out=stream, residual=stream, out_norm=out_norm, config=config)
                is stream
            )
            assert violations(stream, want, bound) is None, (
                f"{config} in place, out_norm={out_norm is not None}"
            )
    big, w, _ = _case((2, 6), 40, 48, torch.float32, 93)
    x = big[:, ::2]  # [2, 3, 48], row stride 96
    wide_r = _residual((2, 3, 80), torch.float32, 94)
    r = wide_r[..., ::2]  # [2, 3, 40], column stride 2
    wide_norm = _norm(96, torch.float32, False, 95)
    norm = NormSpec(wide_norm.weight[::2], wide_norm.eps)  # [48], stride 2
    got = linear_triton(x, w, in_norm=norm, residual=r, weight_is_constant=True, residual_is_settled=True)
    assert got.shape == (2, 3, 40)
    assert violations(got, *linear_oracle(x, w, in_norm=norm, residual=r)) is None
    got = gated_mlp_triton(x, w, "silu", in_norm=norm)
    assert violations(got, *gated_oracle(x, w, "silu", in_norm=norm)) is None


# -- the kernels compiled ahead of time for an H100 (sm_90), no GPU needed ----------------------------

H100_SHARED_MEMORY = 227 * 1024  # the most dynamic shared memory one block may opt into on sm_90


def _compile_for_sm90(
    kernel: Any, runtime: dict[str, int | float], constexprs: dict[str, Any], options: dict[str, int]
) -> Any:
    """Compile ``kernel`` as a bf16 launch with these arguments would (the specialisations Triton's
    launcher makes: pointers 16-byte aligned, ints that are multiples of 16 marked so, ints equal to
    1 made constants, floats as fp32; partials float32) for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature: dict[str, str] = {}
    consts: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(kernel.arg_names):
        if name.endswith("_ptr"):
            signature[name] = "*fp32" if name == "part_ptr" else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in runtime and isinstance(runtime[name], float):
            signature[name] = "fp32"
        elif name in runtime and runtime[name] != 1:
            signature[name] = "i32"
            if int(runtime[name]) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            consts[(i,)] = runtime[name] if name in runtime else constexprs[name]
    source = ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


class Launch:
    """One call as gemv.launch.launch would make it: a weight ``[n, k]``, ``rows``, a config, the stages."""

    def __init__(
        self, what: str, config: GemvConfig, n: int, k: int, rows: int, gated: bool, *,
        in_norm: bool = False, unit_offset: bool = False, residual: bool = False, out_norm: bool = False,
        prefetch: bool = False, settled: bool = False,
    ) -> None:  # fmt: skip
        self.what, self.config, self.n, self.k, self.rows, self.gated = what, config, n, k, rows, gated
        self.in_norm, self.unit_offset, self.residual, self.out_norm = (
            in_norm,
            unit_offset,
            residual,
            out_norm,
        )
        self.prefetch, self.settled = prefetch, settled

    def compile(self) -> list[tuple[str, Any]]:
        """The main kernel and the combine it launches (if any), compiled: ``[(kernel name, compiled)]``."""
        c, n, k, rows = self.config, self.n, self.k, self.rows
        n_out = n // 2 if self.gated else n
        per, splits = split_plan(k, c.block_k, c.split_k)
        partials = splits > 1 or self.out_norm
        rows_pad = 1 << (rows - 1).bit_length()
        rows_pad = rows_pad if c.path == "fma" else max(16, rows_pad)
        norm_block = min(1 << (k - 1).bit_length(), gemv_launch.NORM_TILE_ELEMENTS)
        strides = {"stride_ps": rows * n if partials else 0, "stride_pm": n if partials else n_out, "stride_om": n_out,
                   "stride_rm": n_out, "stride_rn": 1}  # fmt: skip
        runtime = {
            "rows": rows, "n_out": n_out, "k": k, "tiles_per_split": per // c.block_k, "up_offset": n_out if self.gated else 0,
            "eps": 1e-6, "stride_xm": k, "stride_xk": 1, **strides,
        }  # fmt: skip
        constexprs = {
            "ROWS_PAD": rows_pad, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "PATH": gemv.PATHS.index(c.path),
            "EVEN_N": n_out % c.block_n == 0, "EVEN_K": splits * per == k, "DOT_PRECISION": "tf32",
            "GATED": self.gated, "ACT": 0, "HAS_BIAS": not self.gated, "IN_NORM": self.in_norm,
            "UNIT_OFFSET": self.unit_offset, "NORM_ROWS": 1 << (rows - 1).bit_length(), "NORM_BLOCK": norm_block,
            "HAS_RESIDUAL": self.residual and not partials,
            "PREFETCH_TILES": prefetched_tiles(c, per, self.prefetch), "WEIGHT_FIRST": c.weight_first,
            "PREFETCH_RESIDUAL": self.residual and self.settled and not partials, "WRITE_PARTIALS": partials,
            "USE_PDL": True,  # as an H100 launch compiles it
        }  # fmt: skip
        options = {"num_warps": c.num_warps, "num_stages": c.num_stages, **gemv_launch.LAUNCH_OPTIONS}
        compiled = [
            ("_gemv_kernel", _compile_for_sm90(gemv_kernel._gemv_kernel, runtime, constexprs, options))
        ]
        combine_runtime = {
            "splits": splits,
            "n_out": n_out,
            "up_offset": runtime["up_offset"],
            "eps": 1e-6,
            **strides,
        }
        if self.out_norm:
            block = min(1 << (n_out - 1).bit_length(), gemv_launch.OUT_NORM_BLOCK)
            flags = {"BLOCK": block, "ONE_BLOCK": n_out <= block, "UNIT_OFFSET": self.unit_offset, "HAS_BIAS": True,
                     "HAS_RESIDUAL": self.residual, "USE_PDL": True}  # fmt: skip
            options = {"num_warps": 8 if block >= 2048 else 4, "num_stages": 3, **gemv_launch.LAUNCH_OPTIONS}
            compiled.append(
                (
                    "_combine_norm_kernel",
                    _compile_for_sm90(gemv_kernel._combine_norm_kernel, combine_runtime, flags, options),
                )
            )
        elif splits > 1:
            flags = {"BLOCK": gemv_launch.COMBINE_BLOCK, "GATED": self.gated, "ACT": 0, "HAS_BIAS": not self.gated,
                     "HAS_RESIDUAL": self.residual, "USE_PDL": True}  # fmt: skip
            compiled.append(
                (
                    "_combine_kernel",
                    _compile_for_sm90(
                        gemv_kernel._combine_kernel,
                        combine_runtime,
                        flags,
                        {"num_warps": 4, "num_stages": 3, **gemv_launch.LAUNCH_OPTIONS},
                    ),
                )
            )
        return compiled


def _sm90_cases() -> list[Launch]:
    """What the dispatch may launch on the real shapes (its pick and the heuristic, rows 1 and 8),
    plain and with the stages the family's block folds in (weight_is_constant, as the models call
    it); every path with an in_norm, a residual and a prefetched tile; a row wider than the out_norm
    combine's block; and every tile of the sweep on the gated gate_up shape (the most shared memory;
    the sweep times plain products)."""
    cases = []
    for model, hf in REAL_SHAPE_CONFIGS.items():
        config = ModelConfig.from_hf_dict(hf)
        stages = decode_stages(config)
        for proj, (n, k, gated) in decode_projections(config).items():
            st = stages[proj]
            for rows in (1, MAX_ROWS):
                picked = gemv_config(n, k, rows, gated=gated, device=H100)
                heuristic = default_config(n // 2 if gated else n, k, rows, device=H100)
                for label, c in dict.fromkeys([("picked", picked), ("heuristic", heuristic)]):
                    what = f"{model}/{proj} {label} rows {rows}"
                    cases.append(Launch(what, c, n, k, rows, gated))
                    if label == "picked":  # the models' calls: their stages, weight_is_constant, residual_is_settled
                        cases.append(Launch(what + f" {st}", c, n, k, rows, gated, in_norm=st.in_norm, unit_offset=st.unit_offset,
                                            residual=st.residual, out_norm=st.out_norm, prefetch=True, settled=True))  # fmt: skip
    for c in (
        GemvConfig(32, 128, 1, 4, 4, "dot"),
        GemvConfig(64, 128, 3, 4, 3, "dot_t"),
        GemvConfig(16, 256, 2, 4, 2, "fma"),
    ):
        for rows in (1, 5):
            what = f"{c} rows {rows} in_norm"
            cases.append(
                Launch(
                    what + " residual", c, 2048, 2048, rows, False, in_norm=True, residual=True, prefetch=True,
                    settled=rows == 1,
                )
            )
            cases.append(
                Launch(
                    what + " gated", c, 4096, 2048, rows, True, in_norm=True, unit_offset=True, prefetch=True
                )
            )
    cases.append(Launch("out_norm over a row of two blocks", GemvConfig(32, 128, 2), 2 * gemv_launch.OUT_NORM_BLOCK + 64, 512, 2, False,
                        out_norm=True, residual=True))  # fmt: skip
    for block_n, block_k, warps, stages_, path in TILES:
        c = GemvConfig(block_n, block_k, 4, warps, stages_, path)
        rows = FMA_MAX_ROWS if path == "fma" else 4
        cases.append(Launch(f"sweep tile {c}", c, 16384, 2048, rows, True))
    return cases


SM90_CASES = _sm90_cases()


@interpret
@pytest.mark.skipif(not gemv.HAVE_TRITON, reason="compiles the Triton kernels: needs Triton installed")
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter"
)
@pytest.mark.parametrize("launch", SM90_CASES, ids=[c.what for c in SM90_CASES])
def test_kernels_compile_for_h100_within_shared_memory(launch: Launch) -> None:
    """Every configuration the dispatch or the sweep may launch, plain and with the fused stages,
    compiles for sm_90 (no GPU needed) and fits the shared memory of one H100 block; so do the
    combine kernels those launches need."""
    for name, compiled in launch.compile():
        shared = compiled.metadata.shared
        assert shared <= H100_SHARED_MEMORY, (
            f"{launch.what} {name}: {shared} bytes of shared memory > {H100_SHARED_MEMORY}"
        )
        # Eager torch rounds every 16-bit product and sum; a 16-bit multiply-add rounds them once.
        assert not re.search(r"fma\.rn\.(bf16|f16)", compiled.asm["ptx"]), f"{launch.what} {name}: a 16-bit multiply-add"


@interpret
@pytest.mark.skipif(not gemv.HAVE_TRITON, reason="compiles the Triton kernels: needs Triton installed")
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter"
)
def test_only_a_settled_residual_is_read_before_the_dependency_wait() -> None:
    """In the sm_90 PTX of a product with a residual and no weight prefetch: with
    ``residual_is_settled`` a global load comes before ``griddepcontrol.wait`` (the residual tile),
    without it none does (the residual may be the predecessor's output). A combine kernel loads
    the out_norm weight and the residual before its wait either way (its predecessor writes only
    partials), the partials only after it."""
    config = GemvConfig(4, 1024, 1, 4, 3, "fma")
    for settled in (False, True):
        (main,) = Launch(f"settled={settled}", config, 1152, 1024, 1, False, residual=True, settled=settled).compile()
        ptx = main[1].asm["ptx"]
        before = ptx[: ptx.index("griddepcontrol.wait")]
        assert ("ld.global" in before) is settled, f"residual_is_settled={settled}: loads before the wait:\n{before[-400:]}"
    loads = {}
    for residual in (False, True):
        _, (_, combine) = Launch("out_norm", config, 1152, 1024, 1, False, residual=residual, out_norm=True).compile()
        ptx = combine.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        loads[residual] = (len(re.findall(r"ld\.global", ptx[:wait])), len(re.findall(r"ld\.global", ptx[wait:])))
    # Before the wait: the norm weight's loads, plus the residual's when there is one; after it the
    # same loads either way (the partials'): the residual's load did not land after the wait.
    assert loads[False][0] > 0, f"the combine loads no norm weight before the wait: {loads}"
    assert loads[True][0] > loads[False][0] and loads[True][1] == loads[False][1], (
        f"(before, after) the wait, without and with a residual: {loads}"
    )
