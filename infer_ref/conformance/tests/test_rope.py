"""Rotary embeddings: absolute positions, relative invariance, llama3 frequency scaling.

Oracles: the float64 rotation by definition (``oracle.rotate_pairs``) and the llama3 formula
written out (``oracle.llama3_inv_freq``). Tables are float32, as in transformers, so comparisons
that go through them allow float32 angle error (~1e-7 * position).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.config import RopeConfig
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_close, assert_equal
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.definitions import llama3_band, llama3_inv_freq, rotate_pairs

pytestmark = pytest.mark.ir_requires("rope")


def expected_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    if rope.rope_type == "llama3":
        return torch.tensor(llama3_inv_freq(head_dim, rope), dtype=torch.float64)
    base = torch.tensor([1.0 / rope.theta ** (i / head_dim) for i in range(0, head_dim, 2)], dtype=torch.float32)
    return base.double() / (rope.factor if rope.rope_type == "linear" else 1.0)


@given(case=irst.ropes(), length=st.integers(1, 512), data=st.data())
def test_single_position_is_its_row_of_the_full_table(ir_adapter: Adapter, ir_device: str, case: tuple[int, RopeConfig], length: int, data: st.DataObject) -> None:
    """The table for one token at absolute position p equals row p of the table for 0..length-1.

    Guards: *RoPE position not offset by the cache length* (tables indexed from 0 for every call).
    """
    head_dim, rope = case
    p = data.draw(st.integers(0, length - 1), label="p")
    assert ir_adapter.rope_tables is not None
    full_cos, full_sin = ir_adapter.rope_tables(head_dim, rope, torch.arange(length, device=ir_device))
    cos, sin = ir_adapter.rope_tables(head_dim, rope, torch.tensor([p], device=ir_device))
    params = {"head_dim": head_dim, "rope": rope, "length": length, "p": p}
    assert_equal(cos, full_cos[p : p + 1], what=f"cos table of position {p}", params=params)
    assert_equal(sin, full_sin[p : p + 1], what=f"sin table of position {p}", params=params)


@given(case=irst.ropes(), positions=st.lists(st.integers(0, 64), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_rotation_is_the_definition(ir_adapter: Adapter, ir_device: str, case: tuple[int, RopeConfig], positions: list[int], seed: int) -> None:
    """``apply_rope`` rotates dims ``i`` and ``i + D/2`` by ``pos * inv_freq[i]`` (split halves, not
    interleaved pairs), with the configured frequency scaling."""
    head_dim, rope = case
    assert ir_adapter.rope_tables is not None and ir_adapter.apply_rope is not None
    pos = torch.tensor(positions)
    x = torch.randn(2, 3, len(positions), head_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    cos, sin = ir_adapter.rope_tables(head_dim, rope, pos.to(ir_device))
    got = ir_adapter.apply_rope(x.to(ir_device), cos.to(x.dtype), sin.to(x.dtype))
    want = rotate_pairs(x, pos, expected_inv_freq(head_dim, rope))
    assert_close(got, want, what="rotated x", atol=2e-5, rtol=1e-5, params={"head_dim": head_dim, "rope": rope, "positions": positions})


@given(case=irst.ropes(), m=st.integers(0, 256), n=st.integers(0, 256), shift=st.integers(1, 256), seed=st.integers(0, 1000))
def test_score_depends_only_on_relative_distance(ir_adapter: Adapter, ir_device: str, case: tuple[int, RopeConfig], m: int, n: int, shift: int, seed: int) -> None:
    """``rope(q, m) · rope(k, n) == rope(q, m + s) · rope(k, n + s)``: attention scores see only m - n.

    Guards: positions applied inconsistently to queries and cached keys (e.g. a decode query
    rotated at its chunk index while keys were rotated at absolute positions).
    """
    head_dim, rope = case
    assert ir_adapter.rope_tables is not None and ir_adapter.apply_rope is not None
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, head_dim, generator=g, dtype=torch.float64)

    def score(a: int, b: int) -> torch.Tensor:
        assert ir_adapter.rope_tables is not None and ir_adapter.apply_rope is not None
        cq, sq = ir_adapter.rope_tables(head_dim, rope, torch.tensor([a], device=ir_device))
        ck, sk = ir_adapter.rope_tables(head_dim, rope, torch.tensor([b], device=ir_device))
        rq = ir_adapter.apply_rope(q.to(ir_device), cq.double(), sq.double())
        rk = ir_adapter.apply_rope(k.to(ir_device), ck.double(), sk.double())
        return (rq * rk).sum().cpu()

    scale = float(q.norm() * k.norm())
    # float32 angles: error ~ 6e-8 * position per frequency.
    assert_close(
        score(m + shift, n + shift).reshape(1),
        score(m, n).reshape(1),
        what="q·k after shifting both positions",
        atol=1e-4 * scale,
        rtol=0.0,
        params={"head_dim": head_dim, "rope": rope, "m": m, "n": n, "shift": shift},
    )


@given(case=irst.llama3_ropes())
def test_llama3_frequencies_follow_the_formula(ir_adapter: Adapter, ir_device: str, case: tuple[int, RopeConfig]) -> None:
    """The frequencies the tables use (angle at position 1) are llama3's: kept, divided by ``factor``,
    or smoothly blended, band by band.

    Guards: *llama3 rope scaling ignored* (and bands swapped or the blend inverted).
    """
    head_dim, rope = case
    assert ir_adapter.rope_tables is not None
    cos, sin = ir_adapter.rope_tables(head_dim, rope, torch.tensor([1], device=ir_device))
    cos, sin = cos.cpu(), sin.cpu()
    half = head_dim // 2
    got = torch.atan2(sin[0, :half].double(), cos[0, :half].double())  # inv_freq <= 1 < pi: no wrap
    want = torch.tensor(llama3_inv_freq(head_dim, rope), dtype=torch.float64)
    assert_close(
        got,
        want,
        what="inverse frequencies (angles at position 1)",
        atol=1e-7,
        rtol=1e-6,
        params={"head_dim": head_dim, "rope": rope, "bands": llama3_band(head_dim, rope)},
    )


def test_llama3_bands_are_exercised() -> None:
    """The tiny Llama config puts frequencies in all three llama3 bands (else the model-level
    properties could not see a wrong blend)."""
    from infer_ref.conformance.checkpoints.snapshots import TINY_CONFIGS

    p = TINY_CONFIGS["llama"]["rope_parameters"]
    rope = RopeConfig(
        theta=p["rope_theta"],
        rope_type="llama3",
        factor=p["factor"],
        low_freq_factor=p["low_freq_factor"],
        high_freq_factor=p["high_freq_factor"],
        original_max_position_embeddings=p["original_max_position_embeddings"],
    )
    head_dim = TINY_CONFIGS["llama"]["hidden_size"] // TINY_CONFIGS["llama"]["num_attention_heads"]
    assert set(llama3_band(head_dim, rope)) == {"keep", "smooth", "divide"}
    assert not math.isclose(llama3_inv_freq(head_dim, rope)[-1], 1.0 / rope.theta ** ((head_dim - 2) / head_dim))
