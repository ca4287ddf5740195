"""infer_ref against transformers in float64 on CPU, for every family (transformers' float32 casts
in norms and RoPE lifted: both compute the float64 definition, docs/conformance.md).

Each family's tiny config exercises what the real model has: GQA, llama3 RoPE scaling with a small
original context, QK-norm with non-trivial weights, query_pre_attn_scalar != head_dim, and for
Gemma a window of 6 with layer 0 sliding and a global layer. The checkpoint is written once to a
temporary snapshot and loaded by both libraries with their own code. Sequences run to 5x the
Gemma window, so every sliding-window code path is crossed several times.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from infer_ref import KVCache, SamplingParams, generate, load_model
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, TINY_INITS, random_snapshot, tiny_config
from infer_ref.conformance.oracles.float64_definition import lift_float32_casts
from infer_ref.conformance.tiers import EXACT_FLOAT64

transformers = pytest.importorskip("transformers")

TOL = EXACT_FLOAT64  # the float64 tolerance the README quotes; transformers agrees with itself to ~4e-16
SEQ = 30  # 5 windows of the tiny Gemma (window 6)
DTYPE = torch.float64


class IdsDecoder:
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(infer_ref model, transformers model) on the same random checkpoint, no EOS so runs go full length."""
    config = tiny_config(request.param, eos_token_id=None)
    folder = random_snapshot(tmp_path_factory.mktemp(request.param), config, seed=11, init=TINY_INITS[request.param])
    ours, _ = load_model(folder, dtype=DTYPE, device="cpu")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPE, attn_implementation="sdpa").eval()
    return ours, lift_float32_casts(theirs, config)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(5))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@torch.no_grad()
def test_full_sequence_logits_equal_transformers(pair, ids) -> None:
    ours, theirs = pair
    diff = _max_diff(ours(ids), theirs(ids).logits)
    assert diff <= TOL, f"max |Δlogit| {diff:.3e} vs transformers"


@torch.no_grad()
def test_prefill_then_decode_equals_full_forward(pair, ids) -> None:
    ours, theirs = pair
    full = theirs(ids).logits  # [2, SEQ, V]
    cache = KVCache.from_model_config(ours.config, SEQ, batch_size=2, dtype=DTYPE, device="cpu")
    prefill = 4
    worst = _max_diff(ours(ids[:, :prefill], cache)[:, -1], full[:, prefill - 1])
    for pos in range(prefill, SEQ):
        step = ours(ids[:, pos : pos + 1], cache)  # [2, 1, V]
        worst = max(worst, _max_diff(step[:, 0], full[:, pos]))
    assert cache.seq_len == SEQ
    assert worst <= TOL, f"max |Δlogit| {worst:.3e} over {SEQ - prefill} decode steps"


@pytest.mark.parametrize("chunks", [[7, 7, 7, 9], [1, 5, 11, 13], [6, 6, 6, 6, 6], [13, 1, 1, 15]])
@torch.no_grad()
def test_chunked_prefill_at_offsets_equals_full_forward(pair, ids, chunks: list[int]) -> None:
    assert sum(chunks) == SEQ
    ours, theirs = pair
    full = theirs(ids).logits
    cache = KVCache.from_model_config(ours.config, SEQ, batch_size=2, dtype=DTYPE, device="cpu")
    outs, start = [], 0
    for n in chunks:
        outs.append(ours(ids[:, start : start + n], cache, all_logits=True))
        start += n
    diff = _max_diff(torch.cat(outs, dim=1), full)
    assert diff <= TOL, f"chunks {chunks}: max |Δlogit| {diff:.3e}"


def test_greedy_generate_cached_uncached_and_transformers_agree(pair) -> None:
    ours, theirs = pair
    prompt = [5, 17, 99, 3, 42, 8, 64, 1]
    params = SamplingParams(temperature=0.0, max_new_tokens=3 * 6 + 6)
    cached = generate(ours, IdsDecoder(), prompt, params, device="cpu", use_kv_cache=True)
    uncached = generate(ours, IdsDecoder(), prompt, params, device="cpu", use_kv_cache=False)
    with torch.no_grad():
        out = theirs.generate(torch.tensor([prompt]), max_new_tokens=params.max_new_tokens, do_sample=False)
    reference = out[0, len(prompt) :].tolist()
    assert cached.token_ids == uncached.token_ids == reference
    assert cached.text == uncached.text and cached.finish_reason == uncached.finish_reason == "length"


def test_seeded_sampling_cached_equals_uncached(pair) -> None:
    ours, _ = pair
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=1234, max_new_tokens=24)
    cached = generate(ours, IdsDecoder(), [1, 2, 3], params, device="cpu", use_kv_cache=True)
    uncached = generate(ours, IdsDecoder(), [1, 2, 3], params, device="cpu", use_kv_cache=False)
    assert cached.token_ids == uncached.token_ids
    assert len(set(cached.token_ids)) > 1  # really sampled, not a constant stream


@torch.no_grad()
def test_reset_cache_serves_a_second_request(pair, ids) -> None:
    ours, theirs = pair
    cache = KVCache.from_model_config(ours.config, SEQ, batch_size=2, dtype=DTYPE, device="cpu")
    ours(ids.flip(1), cache)  # first request fills the cache
    cache.reset()
    diff = _max_diff(ours(ids, cache, all_logits=True), theirs(ids).logits)
    assert diff <= TOL
