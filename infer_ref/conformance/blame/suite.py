"""The named probes, what each runs, and on which families it means something.

A probe returns the distance that decides it (:func:`~infer_ref.conformance.blame.probes.distance`);
it fails beyond the float32-intermediates tolerance, so rounding never fails a probe. The one
exception is *q-norm ignored*, which fails when doubling the QK-norm gains leaves the
implementation's logits bit for bit unchanged although transformers' move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from infer_ref.conformance import tiers
from infer_ref.conformance.blame import probes as p
from infer_ref.conformance.blame.probes import Checkpoint, ProbeResult, Runner
from infer_ref.conformance.interface.contract import Unsupported

ProbeRun = Callable[[Runner, Checkpoint], tuple[float, bool]]
"""(distance, failed) of one probe on the family's probe checkpoint."""


def _against_oracle(variant: Callable[[Checkpoint], Checkpoint] | None = None) -> ProbeRun:
    def run(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
        ckpt = variant(base) if variant else base
        ids = p.random_ids(ckpt, p.probe_length(base))
        d = p.distance(runner.full(ckpt, ids), p.oracle(ckpt, ids))
        return d, d > tiers.FLOAT32_INTERMEDIATES

    return run


def _one_position(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
    ids = p.random_ids(base, 1)
    d = p.distance(runner.full(base, ids), p.oracle(base, ids))
    return d, d > tiers.FLOAT32_INTERMEDIATES


def _repeated(cached: bool) -> ProbeRun:
    def run(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
        length = p.probe_length(base)
        ids = torch.full((1, length), 5, dtype=torch.long)  # [1, T]: one token repeated
        out = runner.cached(base, ids, p.decode_chunks(length)) if cached else runner.full(base, ids)
        d = p.distance(out, out[:, :1].expand_as(out))  # every position = the first
        return d, d > tiers.FLOAT32_INTERMEDIATES

    return run


def _cached(chunking: Callable[[int], list[int]], variant: Callable[[Checkpoint], Checkpoint] | None = None) -> ProbeRun:
    def run(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
        ckpt = variant(base) if variant else base
        length = p.probe_length(base)
        ids = p.random_ids(ckpt, length)
        d = p.distance(runner.cached(ckpt, ids, chunking(length)), runner.full(ckpt, ids))
        return d, d > tiers.FLOAT32_INTERMEDIATES

    return run


def _cache_length(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
    """Prefill and decode steps on a model without windows (layer 0 alone): the cache has advanced by
    exactly the tokens fed. The distance is the number of positions it is off by."""
    ckpt = p.one_layer(p.without_window(base)) if base.hf_config.get("layer_types") else p.one_layer(base)
    length = p.probe_length(base)
    _, held = runner.cached_with_length(ckpt, p.random_ids(ckpt, length), p.decode_chunks(length))
    return float(abs(held - length)), held != length


def _q_norm_ignored(runner: Runner, base: Checkpoint) -> tuple[float, bool]:
    doubled = p.doubled_q_norm(base)
    ids = p.random_ids(base, p.probe_length(base))
    moved = p.distance(runner.full(doubled, ids), runner.full(base, ids))
    oracle_moved = p.distance(p.oracle(doubled, ids), p.oracle(base, ids))
    return moved, moved == 0.0 and oracle_moved > tiers.FLOAT32_INTERMEDIATES


def _has_qk_norm(family: str) -> bool:
    return family in ("qwen3", "gemma3_text")


def _gemma(family: str) -> bool:
    return family == "gemma3_text"


@dataclass(frozen=True)
class Probe:
    name: str
    run: ProbeRun
    applies: Callable[[str], bool] = lambda family: True
    variant: Callable[[Checkpoint], Checkpoint] | None = None  # the checkpoint it runs on, if not the probe case


PROBES: tuple[Probe, ...] = (
    Probe("one position", _one_position),
    Probe("repeated token", _repeated(cached=False)),
    Probe("repeated token, cached", _repeated(cached=True)),
    Probe("full forward", _against_oracle()),
    Probe("full forward, window off", _against_oracle(p.without_window), _gemma, p.without_window),
    Probe("full forward, every layer sliding", _against_oracle(p.all_sliding), _gemma, p.all_sliding),
    Probe("full forward, unit QK-norm", _against_oracle(p.unit_qk_norm), _has_qk_norm, p.unit_qk_norm),
    Probe("full forward, scalar = head_dim", _against_oracle(p.scalar_is_head_dim), _gemma, p.scalar_is_head_dim),
    Probe("full forward, no llama3 scaling", _against_oracle(p.without_llama3_scaling), lambda f: f == "llama", p.without_llama3_scaling),
    Probe("q-norm ignored", _q_norm_ignored, _has_qk_norm),
    Probe("cache length", _cache_length),
    Probe("decode", _cached(p.decode_chunks)),
    Probe("chunks", _cached(p.chunk_chunks)),
    Probe("decode, window off", _cached(p.decode_chunks, p.without_window), _gemma, p.without_window),
    Probe("chunks, window off", _cached(p.chunk_chunks, p.without_window), _gemma, p.without_window),
    Probe("decode, one layer", _cached(p.decode_chunks, p.one_layer), variant=p.one_layer),
    Probe("chunks, one layer", _cached(p.chunk_chunks, p.one_layer), variant=p.one_layer),
)
PROBE_NAMES = tuple(probe.name for probe in PROBES)


def run_probes(runner: Runner, family: str) -> list[ProbeResult]:
    """Every probe that applies to ``family``; one that raises is recorded with its error, not failed."""
    base = p.probe_case(family)
    results = []
    for probe in PROBES:
        if not probe.applies(family):
            continue
        ckpt = probe.variant(base) if probe.variant else base
        windowed = ckpt.crosses_window(p.probe_length(base))
        try:
            d, failed = probe.run(runner, base)
        except Unsupported as exc:  # a declared refusal gives no evidence
            results.append(ProbeResult(probe.name, family, False, float("nan"), windowed, f"refused: {exc}"))
            continue
        except Exception as exc:  # a correct implementation runs every probe: raising is failing
            results.append(ProbeResult(probe.name, family, True, float("inf"), windowed, raised=f"{type(exc).__name__}: {exc}"))
            continue
        results.append(ProbeResult(probe.name, family, failed, d, windowed))
    if results and all(r.raised for r in results):  # nothing ran at all (float64 refused, say): no evidence either
        results = [replace(r, failed=False, error=f"every probe raised: {r.raised}", raised=None) for r in results]
    return results
