"""Writing to a cache through an adapter and knowing what it must hold: shared by the cache,
snapshot and other cache-level properties.

The oracle is the record of writes itself (:class:`Record`): what each layer must hold is the
concatenation of everything written to it, never something read back from the cache.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from infer_ref.testing import strategies as irst
from infer_ref.testing.adapter import Adapter, CacheSpec
from infer_ref.testing.assertions import assert_equal

# What a precise error may be: never a bare RuntimeError from an indexing accident.
CACHE_ERRORS = (ValueError, IndexError, TypeError)


def entries(spec: CacheSpec, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Distinct random K and V ``[B, Hkv, n, D]`` in the cache's dtype."""
    g = torch.Generator().manual_seed(seed)
    shape = spec.entry_shape(n)
    k = torch.randn(shape, generator=g, dtype=torch.float64).to(spec.dtype)
    v = torch.randn(shape, generator=g, dtype=torch.float64).to(spec.dtype)
    return k.to(spec.device), v.to(spec.device)


class Record:
    """What each layer should hold: the concatenation of everything written to it."""

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self.k: list[list[Tensor]] = [[] for _ in range(spec.num_layers)]
        self.v: list[list[Tensor]] = [[] for _ in range(spec.num_layers)]

    def expected(self, layer: int, extra: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        ks, vs = list(self.k[layer]), list(self.v[layer])
        if extra is not None:
            ks.append(extra[0])
            vs.append(extra[1])
        empty = torch.empty(self.spec.entry_shape(0), dtype=self.spec.dtype, device=self.spec.device)
        return torch.cat([empty, *ks], dim=2), torch.cat([empty, *vs], dim=2)


def check_all_layers(adapter: Adapter, cache: Any, record: Record, params: dict[str, Any], when: str) -> None:
    assert adapter.read_cache is not None
    for layer in range(record.spec.num_layers):
        k, v = adapter.read_cache(cache, layer)
        ek, ev = record.expected(layer)
        assert_equal(k, ek, what=f"K of layer {layer} {when}", params=params)
        assert_equal(v, ev, what=f"V of layer {layer} {when}", params=params)


def make(adapter: Adapter, spec: CacheSpec) -> Any:
    assert adapter.make_cache is not None
    return adapter.make_cache(spec)


def fill(adapter: Adapter, cache: Any, spec: CacheSpec, record: Record, chunks: list[int], seed: int) -> None:
    """Write every layer chunk by chunk, advancing once per chunk (as a model does)."""
    for c, n in enumerate(chunks):
        for layer in range(spec.num_layers):
            k, v = entries(spec, n, seed * 1000 + c * 10 + layer)
            cache.update(layer, k, v)
            record.k[layer].append(k)
            record.v[layer].append(v)
        cache.advance(n)


@st.composite
def cache_cases(draw: st.DrawFn, dtypes: st.SearchStrategy[torch.dtype] | None = None) -> tuple[CacheSpec, list[int]]:
    dims = draw(irst.cache_dims())
    total = draw(st.integers(1, 24))
    slack = draw(st.integers(0, 4))
    dtype = draw(dtypes if dtypes is not None else irst.dtypes())
    spec = CacheSpec(dims.num_layers, dims.batch_size, dims.num_kv_heads, dims.head_dim, total + slack, dtype)
    return spec, draw(irst.chunkings(total))
