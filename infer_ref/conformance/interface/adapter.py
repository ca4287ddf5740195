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
    is declared by ``cache_contract`` (:class:`~infer_ref.conformance.interface.contract.CacheContract`).
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
``store_kvcache(k, v, k_cache, v_cache, slot_mapping) -> None``
    Write rows ``k``/``v`` ``[N, Hkv, D]`` into 4-D caches ``[outer, inner, Hkv, D]`` (a paged
    pool ``[num_blocks, block_size, Hkv, D]``) at slots ``slot_mapping`` ``[N]`` (int64): slot ``s``
    is row ``(s // inner, s % inner)``; ``-1`` writes nothing.
``paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, window) -> out``
    One query per sequence, ``q`` ``[B, H, D]``, over its first ``seq_lens[b]`` positions read
    through ``block_tables`` ``[B, M]`` (int32) from pools ``[num_blocks, block_size, Hkv, D]``;
    ``seq_lens`` ``[B]`` int32; sliding ``window`` or None. Returns ``[B, H, D]``.
``snapshot(cache) -> snap``, ``restore(cache, snap) -> None``, ``materialize(snap) -> cache``
    A frozen copy of a cache's contents, loading one into a cache in place, and building a new
    cache from one.
``declared_unsupported: dict[str, str]``
    Capabilities the implementation does not offer although its callables exist, with the reason
    (a cache whose ``memory_bytes`` counts positions held, not a capacity, say).
``make_block_manager(num_blocks, block_size, hash_fn) -> allocator``
    A prefix-caching block manager over ``num_blocks`` blocks of ``block_size`` positions that
    hashes full blocks with ``hash_fn(parent_hash | None, token_ids) -> int``; the allocator has
    the members of :class:`infer_ref.conformance.oracles.allocator.AllocatorUnderTest`. The state machine of
    ``test_block_manager.py`` drives it beside a model of the specification.
``engine_generate(model, prompts: list[list[int]], spec: EngineSpec) -> list[EngineOutput]``
    Run several requests through a multi-request engine (one paged pool, batched decode) as
    ``spec`` says; per prompt, in order, the generated ids, the logits ``[n, V]`` each was chosen
    from, and how many prompt tokens a prefix hit served. Judged by ``test_engine.py``: prefix
    caching on == off == transformers, and every row of a batch == that request alone; with
    ``spec.num_blocks`` too small for every request at once, the engine preempts, and a seeded
    request's tokens must not change (``test_engine_schedule.py``).
``engine_chunked_generate(model, prompts, spec, max_num_batched_tokens) -> list[EngineOutput]`` (optional)
    ``engine_generate`` with chunked prefill: each engine step spends at most
    ``max_num_batched_tokens`` tokens, shared by the running requests' decodes and prompt chunks.
    Judged by ``test_engine.py``: every request's logits and tokens equal those of whole prefills
    (float64, 1e-9) for any budget from 1 token up.
``engine_trace(model, prompts, spec) -> (list[EngineOutput], list[EngineStep])`` (optional)
    ``engine_generate`` that also says how it scheduled: per decode step, the prompt indices that
    ran in it and those waiting (queue order, the head first). Judged by ``test_engine_schedule.py``:
    never more than ``spec.max_batch`` running, and first-come first-served through preemption
    (a preempted request waits ahead of every request that never ran, and runs again before any of
    them starts). An engine that cannot show its schedule leaves it out: those tests are skipped.
``engine_chunked_trace(model, prompts, spec, max_num_batched_tokens) -> (list[EngineOutput], list[EngineStep])`` (optional)
    ``engine_trace`` with chunked prefill under that per-step token budget, every step reported
    (those that only ran prompt chunks too) with its ``prefilling`` requests. Judged by
    ``test_engine_schedule.py``: a request that decodes keeps decoding at every step until it
    finishes, unless it is preempted (waiting) or recomputing its prompt — never left out of a step
    that spent the budget on other requests' prompt chunks.

Optional hooks of the low-precision, sampler and stopping tiers (appended; each unlocks its own
capability):

``rms_norm(model, x [B, T, E]) -> Tensor``
    The loaded model's final RMSNorm (the one before the LM head) applied to ``x``, in the model's
    dtype, as its forward applies it. Judged bit for bit against the norm's definition in bf16/fp16.
``model_rope_tables(model, positions [T], layer_idx) -> (cos, sin)``
    The rotary tables ``[T, D]`` the *loaded* model uses in layer ``layer_idx`` for those absolute
    positions, in the model's activation dtype (buffers, casts and all: a frequency table that
    ``model.to(bfloat16)`` rounded shows here, where ``rope_tables`` cannot see it).
``sample_probs(logits [V] float64, context: list[int], spec: SamplerSpec) -> Tensor``
    The probabilities ``[V]`` (float64) the sampler draws the next token from, after repetition
    penalty (over ``context``, the prompt and the tokens generated so far), temperature, top-k and
    top-p; exactly 0 outside the kept support. Compared with transformers' logits processors.
``sample(logits [V], context, spec, seed, num_draws) -> list[int]``
    ``num_draws`` draws of the real sampling path from one generator seeded once with ``seed``.
``generate_stopping(model, folder, prompt_ids, max_new_tokens, stop: tuple[str, ...]) -> (tokens, text)``
    Greedy generation from the snapshot ``folder`` (its tokenizer and side files) that stops at
    every EOS id the snapshot declares (``config.json``, ``generation_config.json`` and
    ``tokenizer_config.json``'s ``eos_token``), at the first stop string, or after exactly
    ``max_new_tokens`` tokens. ``tokens`` are the generated ids, *including* the EOS id that ended
    generation (as transformers returns them) and the token that completed a stop string;
    ``text`` is their decoding without special tokens, cut before the earliest stop string.

The suite passes the requested device (``--device``/``--ir-device``) and dtype (``--dtype``/``--ir-dtype``)
to every callable that takes one. A callable may raise :class:`~infer_ref.conformance.interface.contract.Unsupported`
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
from infer_ref.conformance.interface.contract import CacheContract, Unsupported

DEFAULT_IMPL = "infer_ref.conformance.adapters.reference:INFER_REF"
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
    # A cache with a capacity (max_seq_len) to overflow; one that grows declares it unsupported.
    "cache.bounded": ("make_cache", "read_cache"),
    "store": ("store_kvcache",),
    "paged_attention": ("paged_decode_attention",),
    "snapshot": ("make_cache", "read_cache", "snapshot", "restore", "materialize"),
    "block_manager": ("make_block_manager",),
    "engine": ("load_model", "engine_generate"),
    "engine.schedule": ("load_model", "engine_trace"),
    "engine.chunked_prefill": ("load_model", "engine_generate", "engine_chunked_generate"),
    "engine.chunked_schedule": ("load_model", "engine_chunked_trace"),
    "norm": ("load_model", "rms_norm"),
    "rope.model": ("load_model", "model_rope_tables"),
    "sampler": ("sample_probs",),
    "sampler.draw": ("sample",),
    "stopping": ("load_model", "generate_stopping"),
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


@dataclass(frozen=True)
class EngineSpec:
    """How the suite asks an engine to run a set of requests.

    ``temperature`` 0 is greedy; above 0 request ``i`` samples with its own generator seeded
    ``seeds[i]`` (so its tokens must not depend on its neighbours). ``max_batch`` 1 runs the
    requests one at a time. EOS never stops a request early: the suite's models have none in
    their vocabulary.
    """

    max_new_tokens: int
    enable_prefix_caching: bool = True
    block_size: int = 16
    num_blocks: int = 256
    max_batch: int = 8
    temperature: float = 0.0
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineOutput:
    """One request's result: generated ids, the logits ``[len(token_ids), V]`` each was chosen
    from, and the prompt tokens served by a prefix-cache hit (0 without one)."""

    token_ids: list[int]
    logits: Tensor
    num_cached_tokens: int


@dataclass(frozen=True)
class EngineStep:
    """One step of a multi-request engine, by prompt index: who decoded (batch order), who waited
    (queue order, the head first) and, under a per-step token budget, whose prompt was being
    computed in chunks (admitted, not yet decoding; default none). A request in none of them is
    finished. An engine without chunked prefill reports its decode steps only."""

    running: tuple[int, ...]
    waiting: tuple[int, ...]
    prefilling: tuple[int, ...] = ()


@dataclass(frozen=True)
class SamplerSpec:
    """Sampling settings the sampler tier asks for (temperature > 0; None disables top-k / top-p)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0


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
    store_kvcache: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None] | None = None
    paged_decode_attention: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float, int | None], Tensor] | None = None
    snapshot: Callable[[Any], Any] | None = None
    restore: Callable[[Any, Any], None] | None = None
    materialize: Callable[[Any], Any] | None = None
    declared_unsupported: dict[str, str] = field(default_factory=dict, compare=False)
    make_block_manager: Callable[[int, int, Callable[[int | None, Sequence[int]], int]], Any] | None = None
    engine_generate: Callable[[Any, list[list[int]], EngineSpec], list[EngineOutput]] | None = None
    rms_norm: Callable[[Any, Tensor], Tensor] | None = None
    model_rope_tables: Callable[[Any, Tensor, int], tuple[Tensor, Tensor]] | None = None
    sample_probs: Callable[[Tensor, list[int], SamplerSpec], Tensor] | None = None
    sample: Callable[[Tensor, list[int], SamplerSpec, int, int], list[int]] | None = None
    generate_stopping: Callable[[Any, Path, list[int], int, tuple[str, ...]], tuple[list[int], str]] | None = None
    cache_contract: CacheContract = field(default_factory=CacheContract)
    engine_trace: Callable[[Any, list[list[int]], EngineSpec], tuple[list[EngineOutput], list[EngineStep]]] | None = None
    engine_chunked_generate: Callable[[Any, list[list[int]], EngineSpec, int], list[EngineOutput]] | None = None
    engine_chunked_trace: Callable[[Any, list[list[int]], EngineSpec, int], tuple[list[EngineOutput], list[EngineStep]]] | None = None

    def __repr__(self) -> str:
        return f"Adapter({self.name!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying example's arguments with its own pretty printer, which
        lists every dataclass field: one name is enough for the adapter under test."""
        printer.text(repr(self))

    def capabilities(self, device: str = "cpu") -> dict[str, str | None]:
        """capability -> None when supported, else why not (the missing callables or cache members).

        Probes one tiny cache on ``device`` (the device of the run: the adapter never sees another);
        ``declared_unsupported`` overrides the probe for the capabilities it names."""
        out = self._probe_capabilities(device)
        for cap, why in self.declared_unsupported.items():
            out[cap] = f"declared unsupported: {why}"
        return out

    def _probe_capabilities(self, device: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for cap, needed in CAPABILITIES.items():
            missing = [name for name in needed if getattr(self, name) is None]
            out[cap] = f"adapter has no {', '.join(missing)}" if missing else None
        if out["mask"] is not None and self.attend is not None and self.make_cache is not None:
            out["mask"] = None  # probed through attend
        cache_caps = (
            "cache", "cache.storage", "cache.bounded", "attention", "snapshot", *CACHE_OPTIONAL_MEMBERS, *CONTRACT_CAPABILITIES
        )
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
            for cap in ("cache", "cache.storage", "cache.bounded", "attention", "snapshot"):
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
            f"--ir-impl {spec!r} is a {type(obj).__name__}, expected an infer_ref.conformance.interface.adapter.Adapter "
            "(or a callable returning one)"
        )
    return obj


__all__ = ["CAPABILITIES", "DEFAULT_IMPL", "Adapter", "CacheContract", "CacheSpec", "Unsupported", "load_adapter"]
