"""The adapter protocol: what an implementation hands the conformance suite.

An implementation under test is described by one :class:`Adapter` object: a name and a handful of
plain callables. Every callable is optional; the suite groups them into *capabilities* and skips
every test of a capability the adapter lacks ("not supported by <name>"), the way array-api-tests
skips functions a library does not provide. Nothing here depends on infer_ref's own classes: a
cache is any object with the members listed under :data:`CACHE_MEMBERS`, a model is any object
your own callables know how to run.

The callables, their shapes, and why each exists:

``make_cache(spec: CacheSpec) -> cache``
    An empty KV cache for ``spec`` (layers, batch, kv heads, head_dim, capacity, dtype, device, and
    per-layer sliding windows). How it advances, what ``update`` returns and which errors it raises
    is declared by ``cache_contract`` (:class:`~infer_ref.testing.contract.CacheContract`).
``read_cache(cache, layer_idx) -> (K, V) | (K, V, positions)``
    What layer ``layer_idx`` holds, each ``[B, Hkv, S, D]``: positions ``[0, length)`` in order, or,
    for a sliding-window layer that keeps only part of them, also the ``[S]`` absolute positions of
    the held entries. The suite uses it to check that writes land where they should and nothing else moves.
``cache_storage(cache) -> list[Tensor]`` (optional)
    The raw tensors behind a pre-allocated cache, so that ``reset`` can be checked to zero them.
``attention_mask(q_len, start, window) -> Tensor | None`` (optional: without it the mask
    tests probe ``attend``, perturbing one key's value at a time and watching the output)
    Bool ``[q_len, start + q_len]``, True where query ``i`` (absolute position ``start + i``) may
    see key ``j``; ``None`` means every key is visible. ``window`` None: full causal attention.
``rope_tables(head_dim, rope: RopeConfig, positions [T]) -> (cos, sin)``
    The rotary tables ``[T, D]`` (float32, as transformers computes them) for absolute positions.
``apply_rope(x [B, H, T, D], cos, sin) -> Tensor``
    Rotate ``x`` by the tables.
``attend(q, k, v, cache, layer_idx, window, scale) -> out``
    One attention layer over a cache: write ``k``/``v`` ``[B, Hkv, T, D]`` (already rotated) at
    ``[cache.seq_len, +T)`` of ``layer_idx``, attend ``q`` ``[B, H, T, D]`` (``H`` a multiple of
    ``Hkv``) over positions ``[0, seq_len + T)`` with the causal / sliding mask, return
    ``[B, H, T, D]``. Must not advance the cache: the caller does, once all layers wrote.
``load_model(folder, dtype, device) -> model``
    Load a Hugging Face snapshot folder (config.json + model.safetensors).
``make_model_cache(model, max_seq_len, batch_size) -> cache``
    An empty cache sized for ``model``, in the model's dtype and on its device.
``forward(model, input_ids [B, T], cache | None) -> logits [B, T, V]``
    Logits for *every* new position. With a cache the tokens sit at ``cache.seq_len ..`` and the
    cache has advanced by ``T`` on return; without one they are positions ``0 .. T-1``.
``generate(model, prompt_ids: list[int], max_new_tokens, use_kv_cache) -> list[int]``
    Greedy generation (temperature 0), stopping at the config's EOS ids or the length limit.

The suite passes the requested device (``--device``/``--ir-device``) and dtype (``--dtype``/``--ir-dtype``)
to every callable that takes one. A callable may raise :class:`~infer_ref.testing.contract.Unsupported`
for an input it refuses by design: the draw is rejected, never failed, and the report counts it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.config import RopeConfig
from infer_ref.testing.contract import CacheContract, Unsupported

DEFAULT_IMPL = "infer_ref.testing.adapters:INFER_REF"
IMPL_ENV_VAR = "INFER_REF_IMPL"

# Members every cache must have, and the optional ones that unlock further tests.
CACHE_MEMBERS = ("seq_len", "max_seq_len", "update", "advance")
CACHE_OPTIONAL_MEMBERS: dict[str, tuple[str, ...]] = {
    "cache.reset": ("reset",),
    "cache.memory_bytes": ("memory_bytes",),
    "cache.capacity": ("is_full", "remaining_capacity"),
    "cache.crop": ("crop",),
}

# capability -> adapter fields it needs.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "cache": ("make_cache", "read_cache"),
    "cache.storage": ("make_cache", "cache_storage"),
    "mask": ("attention_mask",),  # or, failing that, probed through attend (see capabilities())
    "rope": ("rope_tables", "apply_rope"),
    "attention": ("make_cache", "attend"),
    "model": ("load_model", "make_model_cache", "forward"),
    "generate": ("load_model", "generate", "forward"),
    "golden": ("load_model", "make_model_cache", "forward"),
}
# capability -> what the adapter's cache contract must declare.
CONTRACT_CAPABILITIES: dict[str, tuple[str, Callable[[CacheContract], bool]]] = {
    "cache.errors": ("its cache contract says it does not validate (validates=False)", lambda c: c.validates),
    "cache.window": ("its cache contract keeps no per-layer windows (windows=False)", lambda c: c.windows),
}


@dataclass(frozen=True)
class CacheSpec:
    """Geometry of a cache the suite asks for. Shapes: K/V entries are ``[batch, kv_heads, T, head_dim]``."""

    num_layers: int
    batch_size: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int
    dtype: torch.dtype = torch.float64
    device: str = "cpu"
    layer_windows: tuple[int | None, ...] | None = None
    """Per-layer sliding window (None: full attention); only asked of caches whose contract has ``windows``."""

    def window(self, layer: int) -> int | None:
        return None if self.layer_windows is None else self.layer_windows[layer]

    def entry_shape(self, new_len: int) -> tuple[int, int, int, int]:
        return (self.batch_size, self.num_kv_heads, new_len, self.head_dim)

    @property
    def expected_memory_bytes(self) -> int:
        """``2 (K and V) * L * B * Hkv * S * D * itemsize``: what a pre-allocated cache holds."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return (
            2 * self.num_layers * self.batch_size * self.num_kv_heads * self.max_seq_len * self.head_dim * itemsize
        )


@dataclass(frozen=True, repr=False)
class Adapter:
    """An implementation under test. See the module docstring for each callable's contract."""

    name: str
    version: str = ""
    description: str = ""
    make_cache: Callable[[CacheSpec], Any] | None = None
    read_cache: Callable[[Any, int], tuple[Tensor, Tensor]] | None = None
    cache_storage: Callable[[Any], Sequence[Tensor]] | None = None
    attention_mask: Callable[[int, int, int | None], Tensor | None] | None = None
    rope_tables: Callable[[int, RopeConfig, Tensor], tuple[Tensor, Tensor]] | None = None
    apply_rope: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
    attend: Callable[[Tensor, Tensor, Tensor, Any, int, int | None, float], Tensor] | None = None
    load_model: Callable[[Path, torch.dtype, str], Any] | None = None
    make_model_cache: Callable[[Any, int, int], Any] | None = None
    forward: Callable[[Any, Tensor, Any], Tensor] | None = None
    generate: Callable[[Any, list[int], int, bool], list[int]] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    cache_contract: CacheContract = field(default_factory=CacheContract)

    def __repr__(self) -> str:
        return f"Adapter({self.name!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying example's arguments with its own pretty printer, which
        lists every dataclass field: one name is enough for the adapter under test."""
        printer.text(repr(self))

    def capabilities(self, device: str = "cpu") -> dict[str, str | None]:
        """capability -> None when supported, else why not (the missing callables or cache members).

        Probes one tiny cache on ``device`` (the device of the run: the adapter never sees another)."""
        out: dict[str, str | None] = {}
        for cap, needed in CAPABILITIES.items():
            missing = [name for name in needed if getattr(self, name) is None]
            out[cap] = f"adapter has no {', '.join(missing)}" if missing else None
        if out["mask"] is not None and self.attend is not None and self.make_cache is not None:
            out["mask"] = None  # probed through attend
        cache_caps = ("cache", "cache.storage", "attention", *CACHE_OPTIONAL_MEMBERS, *CONTRACT_CAPABILITIES)
        if self.make_cache is None:
            for cap in cache_caps:
                out.setdefault(cap, "adapter has no make_cache")
                out[cap] = out[cap] or "adapter has no make_cache"
            return out
        try:
            probe = self.make_cache(CacheSpec(1, 1, 1, 2, 2, torch.float32, device))
        except Exception as exc:  # a cache that cannot even be built supports nothing
            for cap in cache_caps:
                out[cap] = f"make_cache failed: {type(exc).__name__}: {exc}"
            return out
        required = [m for m in CACHE_MEMBERS if not (m == "advance" and self.cache_contract.advance != "explicit")]
        required = [m for m in required if not (m == "seq_len" and self.cache_contract.length is not None)]
        missing = [m for m in required if not hasattr(probe, m)]
        if missing:
            for cap in ("cache", "cache.storage", "attention"):
                out[cap] = f"its cache has no {', '.join(missing)}"
        for cap, members in CACHE_OPTIONAL_MEMBERS.items():
            lacking = [m for m in members if not hasattr(probe, m)]
            out[cap] = out["cache"] or (f"its cache has no {', '.join(lacking)}" if lacking else None)
        for cap, (why, declared) in CONTRACT_CAPABILITIES.items():
            out[cap] = out["cache"] or (None if declared(self.cache_contract) else why)
        return out


def load_adapter(spec: str) -> Adapter:
    """Import ``module:object`` (or ``module``, meaning ``module:ADAPTER``).

    ``object`` may be an :class:`Adapter` or a zero-argument callable returning one.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or "ADAPTER"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--ir-impl {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--ir-impl {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Adapter) and callable(obj):
        obj = obj()
    if not isinstance(obj, Adapter):
        raise ValueError(
            f"--ir-impl {spec!r} is a {type(obj).__name__}, expected an infer_ref.testing.adapter.Adapter "
            "(or a callable returning one)"
        )
    return obj


__all__ = ["CAPABILITIES", "DEFAULT_IMPL", "Adapter", "CacheContract", "CacheSpec", "Unsupported", "load_adapter"]
