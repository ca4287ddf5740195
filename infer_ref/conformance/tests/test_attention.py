"""Attention over a cache: prefill + decode and any chunking equal full-sequence attention (float64).

The oracle is ``oracle.naive_attention`` over the whole sequence with the definition's mask: the
rows of a chunk must equal the same rows of the full computation. Two layers per cache, layer 0
sliding and layer 1 global, so a cache or mask that mixes layers shows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_close, fail
from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import commit, layer_length
from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys

# One attention layer in a low-precision dtype against the float64 oracle on the same (rounded)
# inputs: softmax and the weighted sum each round once or twice, so a few units of the output's
# last place. float64 is the exact tier.
ATTENTION_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

pytestmark = pytest.mark.ir_requires("attention")


@st.composite
def attention_cases(draw: st.DrawFn) -> dict:
    dims = draw(irst.cache_dims(max_layers=1))
    window = draw(st.integers(1, 8))
    total = draw(st.one_of(st.sampled_from([window, window + 1, 2 * window + 1, 3 * window]), st.integers(1, 3 * window + 2)))
    chunks = draw(st.one_of(irst.chunkings(total), irst.prefill_then_decode(total)))
    return {
        "dims": dims,
        "window": window,
        "total": total,
        "chunks": chunks,
        "slack": draw(st.integers(0, 4)),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(case=attention_cases())
def test_chunked_attention_equals_full_sequence_attention(ir_adapter: Adapter, ir_device: str, ir_dtype: torch.dtype, case: dict) -> None:
    """Every chunk's output equals the same rows of full-sequence attention, for a sliding layer and
    a global layer sharing one cache, with GQA and batch > 1.

    Guards: *sliding-window mask missing on decode*, *window off-by-one*, *causal mask top-left
    aligned for T>1 over a cache*, *unwritten cache slots attended*, *layers aliasing one cache slice*.
    """
    dims, window, total, chunks = case["dims"], case["window"], case["total"], case["chunks"]
    g = torch.Generator().manual_seed(case["seed"])
    b, h, hkv, d = dims.batch_size, dims.num_heads, dims.num_kv_heads, dims.head_dim
    windows = (window, None)  # layer 0 sliding, layer 1 global
    q = [torch.randn(b, h, total, d, generator=g, dtype=torch.float64).to(ir_dtype) for _ in windows]
    k = [torch.randn(b, hkv, total, d, generator=g, dtype=torch.float64).to(ir_dtype) for _ in windows]
    v = [torch.randn(b, hkv, total, d, generator=g, dtype=torch.float64).to(ir_dtype) for _ in windows]
    scale = d**-0.5
    full = [naive_attention(q[i], k[i], v[i], visible_keys(total, 0, w), scale) for i, w in enumerate(windows)]
    q, k, v = ([t.to(ir_device) for t in ts] for ts in (q, k, v))
    tol = ATTENTION_TOLERANCE[ir_dtype]
    assert ir_adapter.make_cache is not None and ir_adapter.attend is not None
    cache = ir_adapter.make_cache(CacheSpec(2, b, hkv, d, total + case["slack"], ir_dtype, ir_device, windows))
    start = 0
    for c, n in enumerate(chunks):
        end = start + n
        for layer, w in enumerate(windows):
            out = ir_adapter.attend(
                q[layer][:, :, start:end], k[layer][:, :, start:end], v[layer][:, :, start:end], cache, layer, w, scale
            )
            assert_close(
                out,
                full[layer][:, :, start:end],
                what=f"attention output of layer {layer} (window {w}) for chunk {c} = positions [{start}, {end})",
                atol=tol,
                rtol=tol,
                params=case,
            )
        commit(ir_adapter.cache_contract, cache, n)
        start = end
        lengths = [layer_length(ir_adapter.cache_contract, cache, layer) for layer in range(2)]
        if lengths != [start, start]:
            fail(f"layer lengths {lengths} after {start} positions", params=case)
