"""The switches of the mutant machinery: one per planted bug; the defaults reproduce infer_ref exactly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache
from infer_ref.conformance.interface.adapter import CacheSpec
from infer_ref.masks import attention_mask

MaskFn = Callable[[int, int, "int | None", "torch.device | str"], "Tensor | None"]





@dataclass(frozen=True)
class Knobs:
    """One switch per planted bug; the defaults reproduce infer_ref exactly."""

    mask: MaskFn = attention_mask
    rope_offset: bool = True  # False: positions 0..T-1 on every call
    rope_offset_from_sliding_layer: bool = False  # offset = min(seq_len, window) when layer 0 slides
    first_layer_window_everywhere: bool = False
    pad_mask_to_capacity: bool = False  # with FullBufferCache: the mask covers the written length only
    advance: str = "once"  # "once" | "twice" | "skip_decode"
    v_rotated: bool = False
    qk_norm: str = "before_rope"  # "before_rope" | "after_rope" | "missing"
    scale_from_head_dim: bool = False
    embed_scale_unrounded: bool = False
    llama3_ignored: bool = False
    cache_factory: Callable[[CacheSpec], Any] | None = None
    cache_cls: type[KVCache] = KVCache
    store_kvcache: Callable[..., None] | None = None  # replaces the adapter's store
    paged_decode_attention: Callable[..., Tensor] | None = None  # replaces the adapter's paged read
    norm_precision: str = "fp32"  # "fp32" | "low_accumulate" | "gemma_one_plus_w_low"
    rope_precision: str = "fp32"  # "fp32" | "angles_low" | "inv_freq_low"
    sampler: str = "reference"  # | "top_p_before_temperature" | "top_k_strict" | "race_inverted"
    # "reference" | "eos_ignored" | "eos_config_only" | "eos_first_id_only" | "one_token_too_many" | "eos_dropped"
    # | "stop_first_listed" | "stop_within_token"
    stopping: str = "reference"
    engine_class: type | None = None  # replaces infer_ref's Engine behind engine_generate / engine_trace
