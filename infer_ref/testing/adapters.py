"""infer_ref's own adapter: the first user of the protocol in :mod:`infer_ref.testing.adapter`.

Select it with ``--ir-impl=infer_ref.testing.adapters:INFER_REF`` (the default). Every callable is
a thin call into the real code: the suite tests ``KVCache``, ``attention_mask``, the RoPE tables
and the decoders themselves, not copies of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import infer_ref
from infer_ref.cache.contiguous import KVCache
from infer_ref.config import RopeConfig
from infer_ref.engine.generate import generate as _generate
from infer_ref.engine.sampling import SamplingParams
from infer_ref.loader import load_model as _load_model
from infer_ref.models.common import RotaryEmbedding, apply_rope, attention_mask, grouped_query_attention
from infer_ref.testing.adapter import Adapter, CacheSpec


def make_cache(spec: CacheSpec) -> KVCache:
    return KVCache.allocate(
        spec.num_layers,
        spec.num_kv_heads,
        spec.head_dim,
        spec.max_seq_len,
        batch_size=spec.batch_size,
        dtype=spec.dtype,
        device=spec.device,
    )


def read_cache(cache: KVCache, layer_idx: int) -> tuple[Tensor, Tensor]:
    """``[B, Hkv, seq_len, D]`` K and V of one layer."""
    return cache.k[layer_idx, :, :, : cache.seq_len], cache.v[layer_idx, :, :, : cache.seq_len]


def cache_storage(cache: KVCache) -> Sequence[Tensor]:
    return (cache.k, cache.v)


def mask(q_len: int, start: int, window: int | None) -> Tensor | None:
    return attention_mask(q_len, start, window, "cpu")


def rope_tables(head_dim: int, rope: RopeConfig, positions: Tensor) -> tuple[Tensor, Tensor]:
    return RotaryEmbedding(head_dim, rope).to(positions.device)(positions, torch.float32)


def attend(
    q: Tensor, k: Tensor, v: Tensor, cache: Any, layer_idx: int, window: int | None, scale: float
) -> Tensor:
    """The attention core of ``infer_ref.models.common.Attention`` after projections and RoPE."""
    start, t = cache.seq_len, q.shape[2]
    keys, values = cache.update(layer_idx, k, v)  # [B, Hkv, S, D]
    return grouped_query_attention(q, keys, values, attention_mask(t, start, window, q.device), scale)  # [B, H, T, D]


def load_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    model, _ = _load_model(folder, dtype=dtype, device=device)
    return model


def make_model_cache(model: Any, max_seq_len: int, batch_size: int) -> KVCache:
    param = next(model.parameters())
    return KVCache.from_model_config(
        model.config, max_seq_len, batch_size=batch_size, dtype=param.dtype, device=param.device
    )


@torch.inference_mode()
def forward(model: Any, input_ids: Tensor, cache: Any) -> Tensor:
    if cache is None:
        return model(input_ids)
    return model(input_ids, kv_cache=cache, all_logits=True)


class _NoTokenizer:
    """``generate`` decodes text for stop strings; the suite compares token ids only."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return ""


def generate(model: Any, prompt_ids: list[int], max_new_tokens: int, use_kv_cache: bool) -> list[int]:
    device = next(model.parameters()).device
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    result = _generate(model, _NoTokenizer(), prompt_ids, params, device=device, use_kv_cache=use_kv_cache)
    return list(result.token_ids)


INFER_REF = Adapter(
    name="infer_ref",
    version=infer_ref.__version__,
    description="the reference implementation (KVCache, models.common, loader, engine.generate)",
    make_cache=make_cache,
    read_cache=read_cache,
    cache_storage=cache_storage,
    attention_mask=mask,
    rope_tables=rope_tables,
    apply_rope=apply_rope,
    attend=attend,
    load_model=load_model,
    make_model_cache=make_model_cache,
    forward=forward,
    generate=generate,
)
ADAPTER = INFER_REF
