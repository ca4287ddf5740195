"""Hugging Face transformers as a third-party implementation under test.

Four adapters, one per (cache, attention) pair: ``DYNAMIC_SDPA`` (the default, ``ADAPTER``),
``DYNAMIC_EAGER``, ``STATIC_SDPA``, ``STATIC_EAGER``. They are written against transformers' public
API only (``AutoModelForCausalLM``, ``DynamicCache``, ``StaticCache``, ``Cache.update`` /
``get_seq_length`` / ``reset`` / ``crop``), the way an engine team would adapt its own code::

    infer-ref conformance --impl infer_ref.conformance.adapters.transformers:STATIC_SDPA \\
        --xfails infer_ref/conformance/xfails/transformers-static.txt

transformers caches move each layer's length inside ``update`` and take positions from the
caller (``cache_position``); a ``StaticCache`` returns its whole buffer. Both are declared in the
adapters' :class:`~infer_ref.conformance.interface.contract.CacheContract`. Calls pass straight through: every
behaviour the kit reports is transformers' own. The checked-in xfail files name each one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import CacheContract
from infer_ref.conformance.oracles.transformers_cache import forward_with_cache


class HFCache:
    """A transformers ``Cache`` with the kit's ``update(layer, k, v)`` argument order.

    ``update`` computes the ``cache_position`` a transformers model would pass (the layer's length
    onwards) and hands everything to ``Cache.update`` unchanged.
    """

    def __init__(self, hf: Any, max_seq_len: int) -> None:
        self.hf = hf
        self.max_seq_len = max_seq_len

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start = self.length(layer_idx)
        positions = torch.arange(start, start + k.shape[2], device=k.device)
        return self.hf.update(k, v, layer_idx, {"cache_position": positions})

    def length(self, layer_idx: int) -> int:
        return int(self.hf.get_seq_length(layer_idx))

    def reset(self) -> None:
        self.hf.reset()


class HFDynamicCache(HFCache):
    def crop(self, keep: int) -> None:
        """Keep positions ``[0, keep)``: ``Cache.crop(-n)`` removes the last ``n`` in every
        transformers 5 release (a positive argument changed meaning between releases)."""
        remove = self.length(0) - keep
        if remove > 0:
            self.hf.crop(-remove)


def _geometry_config(spec: CacheSpec) -> Any:
    """A config describing only the cache geometry (what ``StaticCache`` needs to allocate)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_kv_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        hidden_size=spec.num_kv_heads * spec.head_dim,
        max_position_embeddings=max(spec.max_seq_len, 1),
    )


def make_dynamic_cache(spec: CacheSpec) -> HFDynamicCache:
    from transformers import DynamicCache

    return HFDynamicCache(DynamicCache(), spec.max_seq_len)


def make_static_cache(spec: CacheSpec) -> HFCache:
    from transformers import StaticCache

    return HFCache(StaticCache(config=_geometry_config(spec), max_cache_len=spec.max_seq_len), spec.max_seq_len)


def read_cache(cache: HFCache, layer_idx: int) -> tuple[Tensor, Tensor]:
    """The layer's ``keys``/``values`` up to its length (a static layer's buffer holds more)."""
    n = cache.length(layer_idx)
    layer = cache.hf.layers[layer_idx]
    if not getattr(layer, "is_initialized", True) or layer.keys is None:
        empty = torch.empty(0, 0, 0, 0)
        return empty, empty
    return layer.keys[:, :, :n], layer.values[:, :, :n]


# -- models ------------------------------------------------------------------------------------------


def load_model(folder: Path, dtype: torch.dtype, device: str, *, attention: str) -> Any:
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # its stubs type from_pretrained as a model method
    model = auto.from_pretrained(str(folder), dtype=dtype, attn_implementation=attention)
    return model.to(device).eval()


def make_dynamic_model_cache(model: Any, max_seq_len: int, batch_size: int) -> HFDynamicCache:
    from transformers import DynamicCache

    return HFDynamicCache(DynamicCache(config=model.config), max_seq_len)


def make_static_model_cache(model: Any, max_seq_len: int, batch_size: int) -> HFCache:
    from transformers import StaticCache

    return HFCache(StaticCache(config=model.config, max_cache_len=max_seq_len), max_seq_len)


@torch.no_grad()  # not inference_mode: a StaticCache allocated inside it could not be reset outside it
def forward(model: Any, input_ids: Tensor, cache: HFCache | None) -> Tensor:
    if cache is None:
        return model(input_ids=input_ids, use_cache=False).logits
    out, _ = forward_with_cache(model, cache.hf, input_ids=input_ids, use_cache=True)  # the cache is updated in place
    return out.logits


def _generate(model: Any, prompt_ids: list[int], max_new_tokens: int, use_kv_cache: bool, *, static: bool) -> list[int]:
    from transformers import GenerationConfig

    eos = model.config.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        use_cache=use_kv_cache,
        eos_token_id=eos,
        pad_token_id=0,
        cache_implementation="static" if static and use_kv_cache else None,
    )
    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return [int(t) for t in out[0, len(prompt_ids) :]]


def _version() -> str:
    try:
        import transformers
    except ImportError:
        return "(not installed)"
    return str(transformers.__version__)


def _adapter(cache: str, attention: str) -> Adapter:
    static = cache == "static"
    return Adapter(
        name=f"transformers-{cache}-{attention}",
        version=_version(),
        description=f"transformers {'StaticCache' if static else 'DynamicCache'}, {attention} attention",
        make_cache=make_static_cache if static else make_dynamic_cache,
        read_cache=read_cache,
        load_model=lambda folder, dtype, device: load_model(folder, dtype, device, attention=attention),
        make_model_cache=make_static_model_cache if static else make_dynamic_model_cache,
        forward=forward,
        generate=lambda model, prompt, n, use_cache: _generate(model, prompt, n, use_cache, static=static),
        cache_contract=CacheContract(
            advance="in_update",
            update_returns="buffer" if static else "prefix",
            empty_write="ignored",  # transformers appends / copies zero positions without complaint
            length=lambda c, layer: c.length(layer),
        ),
    )


DYNAMIC_SDPA = _adapter("dynamic", "sdpa")
DYNAMIC_EAGER = _adapter("dynamic", "eager")
STATIC_SDPA = _adapter("static", "sdpa")
STATIC_EAGER = _adapter("static", "eager")
ADAPTER = DYNAMIC_SDPA

__all__ = ["ADAPTER", "DYNAMIC_EAGER", "DYNAMIC_SDPA", "STATIC_EAGER", "STATIC_SDPA"]
