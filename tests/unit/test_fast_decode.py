"""The static-shape cache and the fast decode path, against the eager path and full recompute.

The fast path runs the same model code with a ``StaticKVCache`` (positions and masks from a
device-side position, K/V over all ``S_max`` slots) and one decode step replayed per token. On
CPU nothing is captured, but the step is the same static-shape code that CUDA captures.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infer_ref import KVCacheOverflowError, UsageError, load_model
from infer_ref.cache.static import StaticKVCache
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, WeightInit, random_snapshot, tiny_config
from infer_ref.engine import FastDecoder
from infer_ref.engine.capture import sliced_argmax
from infer_ref.engine.generate import generate
from infer_ref.masks import attention_mask
from infer_ref.sampling import SamplingParams

PROMPT = [5, 9, 17, 33, 2 + 60, 71, 100]
STEPS = 24  # crosses the tiny Gemma window (6) several times


class Decoder:
    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def _load(tmp_path_factory, family: str, dtype: torch.dtype):
    folder = tmp_path_factory.mktemp(family)
    random_snapshot(folder, tiny_config(family), seed=11, init=WeightInit(gain=2.0))
    model, config = load_model(folder, dtype=dtype, device="cpu")
    model.config = dataclasses.replace(config, eos_token_ids=())  # always run the full length
    return model


@pytest.fixture(scope="module", params=[(f, d) for f in FAMILIES for d in (torch.float64, torch.float32)],
                ids=lambda p: f"{p[0]}-{str(p[1]).removeprefix('torch.')}")
def model(request, tmp_path_factory):
    return _load(tmp_path_factory, *request.param)


# -- the static cache ----------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 1, 3, 6])
@pytest.mark.parametrize(("pos", "t"), [(0, 1), (0, 5), (3, 1), (7, 4), (10, 1)])
def test_static_mask_is_the_contiguous_mask_padded_with_invisible_slots(pos, t, window) -> None:
    cache = StaticKVCache(torch.zeros(1, 1, 1, 16, 2), torch.zeros(1, 1, 1, 16, 2))
    cache.set_position(pos)
    mask = cache.attention_mask(t, window)
    assert mask.shape == (t, 16)
    expected = attention_mask(t, pos, window, "cpu")
    if expected is None:
        expected = torch.ones(t, pos + t, dtype=torch.bool)
    assert torch.equal(mask[:, : pos + t], expected)
    assert not mask[:, pos + t :].any(), "slots past the written positions must never be visible"
    assert torch.equal(cache.positions(t), torch.arange(pos, pos + t))


def test_static_update_writes_at_the_device_position_and_returns_all_slots() -> None:
    cache = StaticKVCache(torch.zeros(2, 1, 1, 8, 2), torch.zeros(2, 1, 1, 8, 2))
    cache.set_position(3)
    k = torch.arange(4.0).reshape(1, 1, 2, 2)
    k_all, v_all = cache.update(1, k, -k)
    assert k_all.shape == (1, 1, 8, 2)
    assert torch.equal(k_all[0, 0, 3:5], k[0, 0]) and torch.equal(v_all[0, 0, 3:5], -k[0, 0])
    assert not cache.k[0].any(), "another layer was written"
    cache.advance(2)
    assert cache.seq_len == 5 and int(cache.pos) == 5


def test_static_cache_refuses_overflow() -> None:
    cache = StaticKVCache(torch.zeros(1, 1, 1, 4, 2), torch.zeros(1, 1, 1, 4, 2))
    cache.advance(3)
    with pytest.raises(KVCacheOverflowError, match="max_seq_len is 4"):
        cache.update(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(KVCacheOverflowError):
        cache.advance(2)
    assert cache.seq_len == 3 and int(cache.pos) == 3


def test_stale_slots_are_never_attended(model) -> None:
    """Garbage in every slot past the position must not change a single logit."""
    ids = torch.tensor([PROMPT])
    full = model(ids)  # [1, T, V]
    clean = StaticKVCache.from_model_config(model.config, 32, dtype=full.dtype, device="cpu")
    dirty = StaticKVCache.from_model_config(model.config, 32, dtype=full.dtype, device="cpu")
    dirty.k.fill_(1e3)
    dirty.v.fill_(-1e3)
    a = model(ids[:, :4], clean, all_logits=True)
    b = model(ids[:, :4], dirty, all_logits=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for i in range(4, len(PROMPT)):
        a = model(ids[:, i : i + 1], clean)
        b = model(ids[:, i : i + 1], dirty)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        tol = 1e-10 if full.dtype == torch.float64 else 2e-4
        torch.testing.assert_close(a[0, -1], full[0, i], rtol=tol, atol=tol)


# -- the fast decoder ----------------------------------------------------------------------------


def test_fast_greedy_tokens_equal_eager_tokens(model) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=STEPS)
    eager = generate(model, Decoder(), PROMPT, params, device="cpu")
    fast = generate(model, Decoder(), PROMPT, params, device="cpu", decode="fast")
    assert fast.token_ids == eager.token_ids
    assert fast.finish_reason == eager.finish_reason == "length"
    assert len(fast.timing.decode_times_s) == STEPS - 1
    assert fast.cache_memory_bytes is not None and fast.cache_memory_bytes > 0


def test_fast_seeded_sampling_equals_eager(model) -> None:
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.2, seed=5, max_new_tokens=STEPS)
    eager = generate(model, Decoder(), PROMPT, params, device="cpu")
    fast = generate(model, Decoder(), PROMPT, params, device="cpu", decode="fast")
    assert fast.token_ids == eager.token_ids


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_fast_teacher_forced_logits_match_full_recompute(model, layout: str) -> None:
    """Feed a fixed sequence step by step; every step's logits equal the uncached forward's row
    (the paged layout with 3-position blocks: positions cross many block boundaries)."""
    seq = torch.tensor([PROMPT + [(7 * i + 3) % 128 for i in range(STEPS)]])
    full = model(seq)  # [1, T, V]
    tol = 1e-10 if full.dtype == torch.float64 else 2e-4
    dec = FastDecoder(model, seq.shape[1], device="cpu", cache=layout, block_size=3)
    logits = dec.prefill(seq[:, : len(PROMPT)])
    torch.testing.assert_close(logits[0, -1], full[0, len(PROMPT) - 1], rtol=tol, atol=tol)
    for i in range(len(PROMPT), seq.shape[1]):
        dec.set_input(seq[0, i : i + 1])
        logits = dec.step()
        torch.testing.assert_close(logits[0, -1], full[0, i], rtol=tol, atol=tol, msg=f"position {i}")
    assert dec.cache.seq_len == seq.shape[1] == int(dec.cache.pos)


def test_a_reused_decoder_gives_the_same_tokens(model) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=12)
    dec = FastDecoder(model, len(PROMPT) + 12, device="cpu")
    first = generate(model, Decoder(), PROMPT, params, device="cpu", decode=dec)
    other = generate(model, Decoder(), PROMPT[::-1], params, device="cpu", decode=dec)
    again = generate(model, Decoder(), PROMPT, params, device="cpu", decode=dec)
    assert again.token_ids == first.token_ids
    assert other.token_ids != first.token_ids


def test_fast_decoder_refuses_to_step_past_capacity(model) -> None:
    dec = FastDecoder(model, 64, device="cpu")
    dec.prefill(torch.tensor([[1] * 63]))
    dec.step()
    with pytest.raises(KVCacheOverflowError, match="max_seq_len is 64"):
        dec.step()


def test_fast_stops_at_eos_like_eager(tmp_path_factory) -> None:
    model = _load(tmp_path_factory, "llama", torch.float64)
    params = SamplingParams(temperature=0, max_new_tokens=STEPS)
    eager = generate(model, Decoder(), PROMPT, params, device="cpu")
    eos = eager.token_ids[5]
    model.config = dataclasses.replace(model.config, eos_token_ids=(eos,))
    eager = generate(model, Decoder(), PROMPT, params, device="cpu")
    fast = generate(model, Decoder(), PROMPT, params, device="cpu", decode="fast")
    assert fast.finish_reason == eager.finish_reason == "eos"
    assert fast.token_ids == eager.token_ids


def test_fast_decoder_refuses_an_unknown_cache_layout(model) -> None:
    with pytest.raises(ValueError, match="cache must be one of static, paged, got 'contiguous'"):
        FastDecoder(model, 16, device="cpu", cache="contiguous")


def test_fast_decoder_runs_where_the_model_is_and_refuses_another_device(tmp_path_factory) -> None:
    """Device and dtype come from the model: unset or the model's own device builds the decoder
    there; another device is refused before the model's modules are swapped or anything is built."""
    from infer_ref.fast.modules import FAST_CLASSES

    model = _load(tmp_path_factory, "llama", torch.float64)
    with pytest.raises(UsageError, match=r"device='meta' but the model's parameters are on cpu"):
        FastDecoder(model, 16, device="meta")
    assert not any(type(m) in FAST_CLASSES.values() for m in model.modules()), "the refused decoder swapped modules"
    for device in (None, "cpu"):
        dec = FastDecoder(model, 16, device=device)
        assert dec.device == torch.device("cpu") and dec.cache.dtype == torch.float64
        assert dec.input_ids.device == dec.token_log.device == torch.device("cpu")


def test_generate_refuses_a_fast_decoder_of_another_model_or_too_short(tmp_path_factory) -> None:
    model = _load(tmp_path_factory, "llama", torch.float32)
    params = SamplingParams(temperature=0, max_new_tokens=4)
    short = FastDecoder(model, len(PROMPT) + 4, device="cpu")  # rounded up to SLOT_ALIGN = 64 positions
    with pytest.raises(ValueError, match=r"holds 64 positions .* this request needs 65"):
        generate(model, Decoder(), [1] * 61, params, device="cpu", decode=short)
    other = _load(tmp_path_factory, "llama", torch.float32)
    with pytest.raises(ValueError, match=r"holds 64 positions for another or the same model"):
        generate(other, Decoder(), PROMPT, params, device="cpu", decode=short)
    with pytest.raises(ValueError, match=r"decode must be 'eager', 'fast' or a FastDecoder, got 'captured'"):
        generate(model, Decoder(), PROMPT, params, device="cpu", decode="captured")  # type: ignore[arg-type]


def test_fast_needs_the_kv_cache(model) -> None:
    with pytest.raises(ValueError, match="use_kv_cache"):
        generate(model, Decoder(), PROMPT, SamplingParams(temperature=0, max_new_tokens=2), device="cpu",
                 use_kv_cache=False, decode="fast")


@pytest.mark.parametrize("vocab", [1, 7, 255, 256, 257, 1000, 128256])
@pytest.mark.parametrize("batch", [1, 3])
def test_sliced_argmax_equals_torch_argmax_including_ties(vocab: int, batch: int) -> None:
    """The fast step's two-stage argmax against torch.argmax (first index among ties)."""
    g = torch.Generator().manual_seed(vocab * 10 + batch)
    x = torch.randint(-3, 4, (batch, vocab), generator=g).float()  # few distinct values: many ties
    x[0, vocab // 2 :] = x[0].max()  # a tie spanning many slices
    if batch > 1:
        x[1] = float("-inf")  # all equal and -inf: index 0
        x[2, -1] = 10.0  # the maximum in the padded last slice
    assert torch.equal(sliced_argmax(x), torch.argmax(x, dim=-1, keepdim=True))
    assert torch.equal(sliced_argmax(x.to(torch.bfloat16), slices=7), torch.argmax(x.to(torch.bfloat16), -1, keepdim=True))


@pytest.mark.parametrize("eos_at", [0, 15, 16, 17, 40, 59])
def test_fast_stops_at_an_eos_in_any_chunk_and_times_only_the_tokens_kept(tmp_path_factory, eos_at: int) -> None:
    """The greedy loop reads the step log a chunk behind the steps it runs (READBACK_EVERY = 16):
    an EOS in the first, a middle or the last chunk, or on a chunk's edge, ends generation with
    the eager loop's tokens, and the steps run past it are neither returned nor timed."""
    model = _load(tmp_path_factory, "llama", torch.float64)
    params = SamplingParams(temperature=0, max_new_tokens=64)
    model.config = dataclasses.replace(model.config, eos_token_ids=())
    free = generate(model, Decoder(), PROMPT, params, device="cpu")  # generated tokens only, no EOS
    assert len(free.token_ids) == 64
    eos = free.token_ids[eos_at]
    first = free.token_ids.index(eos)  # the EOS ends generation at its first occurrence
    model.config = dataclasses.replace(model.config, eos_token_ids=(eos,))
    eager = generate(model, Decoder(), PROMPT, params, device="cpu")
    fast = generate(model, Decoder(), PROMPT, params, device="cpu", decode="fast")
    assert fast.finish_reason == eager.finish_reason == "eos"
    assert fast.token_ids == eager.token_ids == free.token_ids[: first + 1]
    assert len(fast.timing.decode_times_s) == first  # token 0 comes from the prefill: one step per later token


def test_the_step_log_holds_each_steps_token_in_order(model) -> None:
    """The device log the greedy loop reads: entry i is step i's argmax (oracle: the logits each
    step returns), and the usable flags are set; reset starts it over."""
    dec = FastDecoder(model, len(PROMPT) + 8, device="cpu")
    for _ in range(2):
        dec.reset()
        dec.prefill(torch.tensor([PROMPT]))
        want = [int(dec.step()[0, -1].argmax()) for _ in range(5)]
        assert dec.token_log[:5, 0].tolist() == want
        assert dec.usable_log[:5].all() and int(dec.log_index) == 5


@pytest.mark.parametrize(
    ("poison", "decidable"),
    [(None, True), ("nan", False), ("inf", False), ("-inf", True), ("all -inf", False), ("nan in the padding slice", False)],
)
def test_checked_sliced_argmax_flags_exactly_what_can_decide_flags(poison: str | None, decidable: bool) -> None:
    """``sliced_argmax(..., checked=True)``'s flag against ``can_decide`` (one amax over the logits):
    NaN or +inf anywhere, or nothing above -inf, and the logits cannot decide a token."""
    from infer_ref.validation import can_decide

    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(1))
    if poison == "nan":
        x[1, 517] = float("nan")
    elif poison == "inf":
        x[0, 3] = float("inf")
    elif poison == "-inf":
        x[0, :500] = float("-inf")
    elif poison == "all -inf":
        x[:] = float("-inf")
    elif poison == "nan in the padding slice":
        x[0, -1] = float("nan")  # 1000 = 7 * 143 - 1: the last slice is the padded one
    token, usable = sliced_argmax(x, slices=7, checked=True)
    assert usable.shape == (1,) and bool(usable) is decidable is bool(can_decide(x))
    if decidable:
        assert torch.equal(token, torch.argmax(x, dim=-1, keepdim=True))
