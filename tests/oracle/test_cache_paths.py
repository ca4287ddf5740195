"""Cache-path invariance: a token's logits must not depend on how its prefix got into the cache.

For Hypothesis-drawn models (all three families; Gemma with windows of 4-8 crossed several times)
and schedules of prefill chunks and decode steps, the same sequence goes through every cache type
— contiguous, static (device-side position, whole-buffer reads), dynamic (concatenation) and paged
(drawn block sizes including 1 and sizes that do not divide the prompt, a scrambled free list) —
and through a snapshot taken at a drawn step and restored into a drawn cache type. In float64:

* every chunk's logits equal the model's own full forward and transformers' (<= 1e-9);
* every cache type holds the same K/V afterwards: layer 0's bitwise (the same computation on the
  same embeddings, merely stored), deeper layers' to the exact tier (their inputs went through
  attention over each layout's keys, whose float64 sums may round differently: 4.4e-16 measured;
  float32 norms used to absorb that, float64 norms keep it);
* a snapshot taken mid-sequence, followed by more writes to its source, restores (same or other
  type, in place or materialized) into a cache that continues with the same logits.

The fixture checkpoints (trained tiny models) run a fixed schedule through every cache type too.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref import load_model
from infer_ref.cache.factory import CACHE_KINDS, build_cache
from infer_ref.conformance import case_models
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.conformance.assertions import assert_close, assert_equal, fail
from infer_ref.conformance.checkpoints.snapshots import FAMILIES
from infer_ref.conformance.oracles.transformers_fp64 import transformers_available, transformers_logits

CHECKPOINTS = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
FIXTURES = ("llama-tiny", "qwen3-tiny", "gemma3-tiny")

pytestmark = pytest.mark.skipif(not transformers_available(), reason="needs transformers (the oracle)")

ATOL = RTOL = 1e-9
F64 = torch.float64


@st.composite
def schedules(draw: st.DrawFn, family: str) -> dict[str, Any]:
    """A model, a batch of ids, a chunking, a paged layout, and where to snapshot and restore."""
    case = draw(irst.model_configs(family))
    total = draw(irst.sequence_lengths(case))
    chunks = draw(st.one_of(irst.chunkings(total), irst.prefill_then_decode(total)))
    return {
        "case": case,
        "ids": draw(irst.token_ids(case.hf_config["vocab_size"], draw(st.integers(1, 2)), total)),
        "chunks": chunks,
        "block_size": draw(st.sampled_from([1, 2, 3, 5, 16])),
        "scramble": draw(st.integers(0, 2**16)),
        "snapshot_after": draw(st.integers(0, len(chunks) - 1)),
        "snapshot_from": draw(st.sampled_from(CACHE_KINDS)),
        "restore_into": draw(st.sampled_from(CACHE_KINDS)),
        "materialize": draw(st.booleans()),
    }


def _params(run: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.describe() if k == "case" else v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in run.items()}


def _cache(kind: str, model: Any, ids: torch.Tensor, run: dict[str, Any]) -> Any:
    return build_cache(
        kind,
        model.config,
        ids.shape[1],
        batch_size=ids.shape[0],
        dtype=F64,
        device="cpu",
        block_size=run["block_size"],
        scramble_seed=run["scramble"],
    )


@torch.inference_mode()
def _feed(model: Any, cache: Any, ids: torch.Tensor, chunks: list[int], start: int) -> list[torch.Tensor]:
    """Logits ``[B, n, V]`` of each chunk fed from position ``start`` on."""
    out = []
    for n in chunks:
        out.append(model(ids[:, start : start + n], kv_cache=cache, all_logits=True))
        start += n
    return out


def _check_chunks(got: list[torch.Tensor], chunks: list[int], start: int, expected: torch.Tensor, label: str, params: dict[str, Any]) -> None:
    for c, (logits, n) in enumerate(zip(got, chunks, strict=True)):
        assert_close(
            logits,
            expected[:, start : start + n],
            what=f"{label}: logits of chunk {c} = positions [{start}, {start + n})",
            atol=ATOL,
            rtol=RTOL,
            params=params,
        )
        start += n


def _model_and_oracle(run: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    """The drawn model (infer_ref, float64) and transformers' float64 logits ``[B, T, V]`` of the run's ids."""
    case = run["case"]
    _, state = case_models.snapshot(case)
    expected = transformers_logits(case.hf_config, state, run["ids"], key=case_models.case_key(case))
    return case_models.load(INFER_REF, case), expected


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_every_cache_type_gives_the_same_logits_and_holds_the_same_kv(family: str, data: st.DataObject) -> None:
    run = data.draw(schedules(family), label="run")
    params = _params(run)
    ids, chunks = run["ids"], run["chunks"]
    model, expected = _model_and_oracle(run)
    with torch.inference_mode():
        full = model(ids)
    assert_close(full, expected, what="full forward vs transformers", atol=ATOL, rtol=RTOL, params=params)

    held: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for kind in CACHE_KINDS:
        cache = _cache(kind, model, ids, run)
        _check_chunks(_feed(model, cache, ids, chunks, 0), chunks, 0, expected, f"{kind} cache", params)
        if cache.seq_len != ids.shape[1]:
            fail(f"{kind} cache: seq_len {cache.seq_len} after {ids.shape[1]} positions", params=params)
        held[kind] = [cache.get_kv(layer) for layer in range(model.config.num_hidden_layers)]
    for kind in CACHE_KINDS[1:]:
        for layer, ((k_ref, v_ref), (k, v)) in enumerate(zip(held[CACHE_KINDS[0]], held[kind], strict=True)):
            same = assert_equal if layer == 0 else functools.partial(assert_close, atol=ATOL, rtol=RTOL)
            same(k, k_ref, what=f"layer {layer} K held by the {kind} cache vs the contiguous one", params=params)
            same(v, v_ref, what=f"layer {layer} V held by the {kind} cache vs the contiguous one", params=params)


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_a_restored_snapshot_continues_with_the_same_logits(family: str, data: st.DataObject) -> None:
    run = data.draw(schedules(family), label="run")
    params = _params(run)
    ids, chunks = run["ids"], run["chunks"]
    model, expected = _model_and_oracle(run)

    cut = run["snapshot_after"] + 1
    head, tail = chunks[:cut], chunks[cut:]
    start = sum(head)
    source = _cache(run["snapshot_from"], model, ids, run)
    _feed(model, source, ids, head, 0)
    snap = source.snapshot()
    frozen = snap.keys.clone()
    _feed(model, source, ids, tail, start)  # the source moves on; the snapshot must not
    if run["materialize"]:
        target = snap.materialize()
    else:
        target = _cache(run["restore_into"], model, ids, run)
        _feed(model, target, ids, chunks[:1], 0)  # something to be replaced
        target.restore(snap)
    if target.seq_len != start:
        fail(f"restored cache holds {target.seq_len} positions, the snapshot {start}", params=params)
    _check_chunks(_feed(model, target, ids, tail, start), tail, start, expected, "after restore", params)
    assert_equal(snap.keys, frozen, what="snapshot keys after the source and the restored cache moved on", params=params)


@functools.cache
def _fixture_model(name: str) -> tuple[Any, Any]:
    return load_model(CHECKPOINTS / name, dtype=F64, device="cpu")


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_fixture_checkpoints_through_every_cache_type(fixture: str, kind: str) -> None:
    """The trained tiny models: prefill, a chunk, then decode steps across the Gemma window."""
    model, config = _fixture_model(fixture)
    ids = torch.randint(0, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(0))
    chunks = [7, 5, 1, 1, 9, *([1] * 7)]
    with torch.inference_mode():
        full = model(ids)
    run = {"block_size": 4, "scramble": 1}
    cache = _cache(kind, model, ids, run)
    _check_chunks(_feed(model, cache, ids, chunks, 0), chunks, 0, full, f"{fixture}, {kind} cache", {"chunks": chunks})
