"""The kernels' torch references on the CPU: cache store, paged gather, paged decode attention.

Expected values come from stated arithmetic (slot ``s`` is row ``(s // inner, s % inner)``), from
a layout built with plain slicing (``infer_ref.conformance.oracles.paged``), and from float64 attention
written out (``infer_ref.conformance.oracles.definitions.naive_attention``): ``softmax(q·kᵀ·scale)·v`` over the
keys at distance ``< window`` from the query, query head ``h`` reading KV head ``h // (H / Hkv)``.
The Triton kernels are checked against these references in ``test_kernels_gpu.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance.assertions import assert_close, assert_equal
from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys
from infer_ref.conformance.oracles.paged import relabel_blocks, scatter_to_paged
from infer_ref.fast.kernels import gather_paged_kv, paged_decode_attention, store_kvcache
from infer_ref.fast.kernels.attention import contiguous_layer_as_paged

SENTINEL = -123.5  # exact in every float dtype: a slot still holding it was never written
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- store ---------------------------------------------------------------------------------------


@st.composite
def store_cases(draw: st.DrawFn) -> dict:
    """A cache geometry, distinct live slots (some replaced by -1) and a layout."""
    outer, inner = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    hkv, d = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    num_slots = outer * inner
    n = draw(st.integers(0, num_slots))
    slots = draw(st.permutations(range(num_slots)))[:n]
    skips = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    mapping = [-1 if skip else s for s, skip in zip(slots, skips, strict=True)]
    return {
        "outer": outer, "inner": inner, "hkv": hkv, "d": d, "mapping": mapping,
        "layout": draw(st.sampled_from(["pool", "layer"])), "dtype": draw(st.sampled_from(DTYPES)),
        "slot_dtype": draw(st.sampled_from([torch.int32, torch.int64])), "seed": draw(st.integers(0, 2**16)),
    }  # fmt: skip


def _caches(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sentinel-filled caches as the store sees them ``[outer, inner, Hkv, D]`` and their storage.

    ``layer``: a contiguous cache layer ``[B=outer, Hkv, S=inner, D]`` passed permuted (a view).
    """
    o, i, h, d, dt = case["outer"], case["inner"], case["hkv"], case["d"], case["dtype"]
    if case["layout"] == "pool":
        k = torch.full((o, i, h, d), SENTINEL, dtype=dt)
        v = torch.full((o, i, h, d), SENTINEL, dtype=dt)
        return k, v, k, v
    k = torch.full((o, h, i, d), SENTINEL, dtype=dt)
    v = torch.full((o, h, i, d), SENTINEL, dtype=dt)
    return k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), k, v


@given(store_cases())
def test_store_writes_exactly_the_mapped_slots(case: dict) -> None:
    """Mapped slots hold their row (bitwise); every other slot keeps the sentinel; -1 writes nothing."""
    k_view, v_view, k_storage, v_storage = _caches(case)
    n = len(case["mapping"])
    g = _gen(case["seed"])
    k = torch.randn(n, case["hkv"], case["d"], generator=g).to(case["dtype"])
    v = torch.randn(n, case["hkv"], case["d"], generator=g).to(case["dtype"])
    store_kvcache(k, v, k_view, v_view, torch.tensor(case["mapping"], dtype=case["slot_dtype"]))
    written = torch.zeros(case["outer"], case["inner"], dtype=torch.bool)
    for row, slot in enumerate(case["mapping"]):
        if slot == -1:
            continue
        o, i = slot // case["inner"], slot % case["inner"]
        written[o, i] = True
        if case["layout"] == "pool":
            got_k, got_v = k_storage[o, i], v_storage[o, i]
        else:  # the layer [B, Hkv, S, D]: batch row o, position i
            got_k, got_v = k_storage[o, :, i], v_storage[o, :, i]
        assert torch.equal(_bits(got_k), _bits(k[row])), f"K of entry {row} not at slot {slot} {case}"
        assert torch.equal(_bits(got_v), _bits(v[row])), f"V of entry {row} not at slot {slot} {case}"
    sentinel = _bits(torch.full((case["hkv"], case["d"]), SENTINEL, dtype=case["dtype"]))
    for o, i in (~written).nonzero().tolist():
        for view in (k_view, v_view):
            assert torch.equal(_bits(view[o, i]), sentinel), f"unmapped slot {o * case['inner'] + i} changed {case}"


def test_minus_one_never_writes_the_last_slot() -> None:
    cache_k = torch.full((2, 4, 1, 2), SENTINEL)
    cache_v = torch.full((2, 4, 1, 2), SENTINEL)
    k = torch.arange(6.0).view(3, 1, 2)
    store_kvcache(k, -k, cache_k, cache_v, torch.tensor([-1, 0, -1]))
    assert torch.equal(cache_k[0, 0], k[1]) and torch.equal(cache_v[0, 0], -k[1])
    assert (cache_k.flatten()[2:] == SENTINEL).all() and (cache_v.flatten()[2:] == SENTINEL).all()


def test_strided_layer_view_writes_row_b_position_pos() -> None:
    """Slot ``b * S + pos`` of ``layer.permute(0, 2, 1, 3)`` is ``layer[b, :, pos, :]``."""
    b, hkv, s, d = 3, 2, 5, 4
    layer_k = torch.full((b, hkv, s, d), SENTINEL)
    layer_v = torch.full((b, hkv, s, d), SENTINEL)
    k = torch.randn(2, hkv, d, generator=_gen(1))
    v = torch.randn(2, hkv, d, generator=_gen(2))
    store_kvcache(k, v, layer_k.permute(0, 2, 1, 3), layer_v.permute(0, 2, 1, 3), torch.tensor([2 * s + 3, 0 * s + 4]))
    assert torch.equal(layer_k[2, :, 3, :], k[0]) and torch.equal(layer_v[2, :, 3, :], v[0])
    assert torch.equal(layer_k[0, :, 4, :], k[1]) and torch.equal(layer_v[0, :, 4, :], v[1])
    assert int((layer_k != SENTINEL).sum()) == 2 * hkv * d


def _store_error_cases() -> list:
    def args(**over: object) -> dict:
        base = {
            "k": torch.ones(2, 2, 4), "v": torch.ones(2, 2, 4),
            "k_cache": torch.full((3, 4, 2, 4), SENTINEL), "v_cache": torch.full((3, 4, 2, 4), SENTINEL),
            "slot_mapping": torch.tensor([0, 5]),
        }  # fmt: skip
        base.update(over)
        return base

    shared = torch.full((3, 4, 2, 4), SENTINEL)
    both = torch.full((2, 3, 4, 2, 4), SENTINEL)  # one buffer: blocks 0-2 as K, blocks 2-4 as V overlap
    return [
        pytest.param(args(slot_mapping=torch.tensor([0, 12])), IndexError, "slots must be in [0, 12)", id="slot past the end"),
        pytest.param(args(slot_mapping=torch.tensor([0, -2])), IndexError, "or -1 (skip)", id="slot below -1"),
        pytest.param(args(slot_mapping=torch.tensor([5, 5])), ValueError, "writes one slot twice", id="duplicate slot"),
        pytest.param(args(slot_mapping=torch.tensor([0.0, 5.0])), TypeError, "slot_mapping must be int32 or int64", id="float slots"),
        pytest.param(args(slot_mapping=torch.tensor([0, 5, 6])), ValueError, "slot_mapping must be [num_tokens=2]", id="slots length"),
        pytest.param(args(k=torch.ones(2, 2, 4, dtype=torch.float64), v=torch.ones(2, 2, 4, dtype=torch.float64)),
                     TypeError, "the store never converts", id="k dtype"),
        pytest.param(args(v=torch.ones(2, 2, 4, dtype=torch.bfloat16)), TypeError, "v has dtype", id="v dtype"),
        pytest.param(args(k=torch.ones(2, 2, 5), v=torch.ones(2, 2, 5)), ValueError, "but the cache holds", id="head_dim"),
        pytest.param(args(v=torch.ones(2, 3, 4)), ValueError, "k and v must both be", id="v shape"),
        pytest.param(args(v_cache=torch.full((3, 4, 2, 4), SENTINEL)[:2]), ValueError, "k_cache and v_cache must both be", id="cache shapes"),
        pytest.param(args(k_cache=torch.full((12, 2, 4), SENTINEL), v_cache=torch.full((12, 2, 4), SENTINEL)),
                     ValueError, "[outer, inner, num_kv_heads, head_dim]", id="3-D cache"),
        pytest.param(args(k_cache=shared, v_cache=shared), ValueError, "share memory", id="same cache twice"),
        pytest.param(args(k_cache=both[0], v_cache=both.view(-1, 4, 2, 4)[2:5]), ValueError, "share memory",
                     id="overlapping views"),
        pytest.param(args(slot_mapping=torch.tensor([0, 5], device="meta")), ValueError, "slot_mapping is on meta", id="device"),
    ]


@pytest.mark.parametrize(("kwargs", "error", "message"), _store_error_cases())
def test_store_refuses_bad_arguments_and_changes_nothing(kwargs: dict, error: type, message: str) -> None:
    before_k, before_v = kwargs["k_cache"].clone(), kwargs["v_cache"].clone()
    with pytest.raises(error, match=re.escape(message)):
        store_kvcache(**kwargs)
    assert torch.equal(_bits(kwargs["k_cache"]), _bits(before_k)), "k_cache changed by a refused store"
    assert torch.equal(_bits(kwargs["v_cache"]), _bits(before_v)), "v_cache changed by a refused store"


def test_separate_halves_of_one_buffer_are_accepted() -> None:
    """K and V as ``kv[0]`` / ``kv[1]`` of one allocation do not overlap: not refused."""
    kv = torch.full((2, 3, 4, 2, 4), SENTINEL)
    store_kvcache(torch.ones(1, 2, 4), -torch.ones(1, 2, 4), kv[0], kv[1], torch.tensor([7]))
    assert (kv[0, 1, 3] == 1).all() and (kv[1, 1, 3] == -1).all()


# -- gather --------------------------------------------------------------------------------------


@st.composite
def paged_cases(draw: st.DrawFn) -> dict:
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    batch = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 40), min_size=batch, max_size=batch))
    return {
        "bs": bs, "lengths": lengths, "hkv": draw(st.integers(1, 3)), "d": draw(st.sampled_from([2, 4, 8])),
        "seed": draw(st.integers(0, 2**16)), "stale": draw(st.integers(0, 3)), "spare": draw(st.integers(0, 3)),
    }  # fmt: skip


def _contiguous_kv(case: dict, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(case["seed"])
    shape = (len(case["lengths"]), case["hkv"], max(case["lengths"]), case["d"])
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def _assert_gather_is_contiguous(layout, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> None:  # type: ignore[no-untyped-def]
    for row, n in enumerate(lengths):
        table = layout.block_tables[row : row + 1]
        assert_equal(gather_paged_kv(layout.k_pool, table, n)[0], k[row, :, :n], what=f"K of row {row} (length {n})")
        assert_equal(gather_paged_kv(layout.v_pool, table, n)[0], v[row, :, :n], what=f"V of row {row} (length {n})")


@given(paged_cases())
def test_gather_equals_the_contiguous_kv_after_scattering_into_permuted_blocks(case: dict) -> None:
    """Stale table entries (past ceil(len/bs)) point at NaN blocks: a reader that looks shows NaN."""
    k, v = _contiguous_kv(case)
    layout = scatter_to_paged(
        k, v, case["lengths"], case["bs"], generator=_gen(case["seed"] + 1),
        spare_blocks=case["spare"], stale_entries=case["stale"],
    )  # fmt: skip
    _assert_gather_is_contiguous(layout, k, v, case["lengths"])
    relabelled = relabel_blocks(layout, _gen(case["seed"] + 2))
    _assert_gather_is_contiguous(relabelled, k, v, case["lengths"])


@pytest.mark.parametrize("bs", [1, 4, 16])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_gather_at_block_boundaries(bs: int, delta: int) -> None:
    n = 3 * bs + delta
    case = {"lengths": [n, max(1, n - bs)], "hkv": 2, "d": 4, "seed": bs * 10 + delta}
    k, v = _contiguous_kv(case)
    layout = scatter_to_paged(k, v, case["lengths"], bs, generator=_gen(bs), stale_entries=2)
    _assert_gather_is_contiguous(layout, k, v, case["lengths"])


def test_gather_refuses_a_table_too_short_for_the_length() -> None:
    pool = torch.zeros(4, 4, 1, 2)
    with pytest.raises(ValueError, match=r"block_tables must be \[B, M>=3\] for 9 positions"):
        gather_paged_kv(pool, torch.zeros(1, 2, dtype=torch.int32), 9)


# -- decode reference ----------------------------------------------------------------------------


@st.composite
def decode_cases(draw: st.DrawFn) -> dict:
    case = draw(paged_cases())
    longest = max(case["lengths"])
    case["groups"] = draw(st.sampled_from([1, 2, 4]))
    case["window"] = draw(st.one_of(st.none(), st.integers(1, longest + 3)))
    case["scale"] = draw(st.sampled_from([0.125, 0.5, 1.0]))
    return case


def _float64_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], scale: float, window: int | None) -> torch.Tensor:
    """Row by row: the query at position n-1 over keys 0..n-1 of its contiguous K/V."""
    rows = []
    for row, n in enumerate(lengths):
        visible = visible_keys(1, n - 1, window)  # [1, n]
        out = naive_attention(q[row][None, :, None], k[row : row + 1, :, :n], v[row : row + 1, :, :n], visible, scale)
        rows.append(out[0, :, 0])
    return torch.stack(rows)


@given(decode_cases())
def test_decode_reference_equals_float64_attention(case: dict) -> None:
    """Windows drawn below and above the lengths; GQA ratios 1, 2, 4; permuted blocks, stale entries."""
    k, v = _contiguous_kv(case)
    h = case["hkv"] * case["groups"]
    q = torch.randn(len(case["lengths"]), h, case["d"], generator=_gen(case["seed"] + 3))
    layout = scatter_to_paged(k, v, case["lengths"], case["bs"], generator=_gen(case["seed"] + 1), stale_entries=case["stale"])
    got = paged_decode_attention(q, layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens, case["scale"], case["window"])
    want = _float64_decode(q, k, v, case["lengths"], case["scale"], case["window"])
    assert_close(got, want, what="paged decode attention", atol=1e-5, rtol=1e-5, params=case)


def test_decode_window_larger_and_smaller_than_the_length() -> None:
    """Length 10: window 3 sees keys 7..9, window 10 and 50 see all ten (no wrap, no clamp error)."""
    case = {"lengths": [10], "hkv": 1, "d": 4, "seed": 5}
    k, v = _contiguous_kv(case)
    q = torch.randn(1, 2, 4, generator=_gen(6))
    layout = scatter_to_paged(k, v, [10], 4, generator=_gen(7))
    args = (q, layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens, 0.5)
    scores = torch.einsum("hd,sd->hs", q[0].double(), k[0, 0].double()) * 0.5  # [H, S]: one KV head
    for window, first in ((3, 7), (10, 0), (50, 0), (None, 0)):
        weights = torch.softmax(scores[:, first:], dim=-1)
        want = (weights @ v[0, 0, first:].double())[None]
        assert_close(paged_decode_attention(*args, window), want, what=f"window {window}", atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("bs", [4, 16])
def test_contiguous_layer_read_through_the_identity_table(bs: int) -> None:
    """The view shares the layer's storage and reads ``layer[b, h, pos]`` at block/offset arithmetic."""
    b, hkv, s, d, groups = 3, 2, 32, 4, 2
    layer_k = torch.randn(b, hkv, s, d, generator=_gen(bs))
    layer_v = torch.randn(b, hkv, s, d, generator=_gen(bs + 1))
    pool, tables = contiguous_layer_as_paged(layer_k, bs)
    assert pool.data_ptr() == layer_k.data_ptr() and pool.stride() == (bs * d, d, s * d, 1)
    for row in range(b):
        for c in range(s // bs):
            assert int(tables[row, c]) == row * (hkv * s // bs) + c
    lengths = [1, 17, 32]
    v_pool, _ = contiguous_layer_as_paged(layer_v, bs)
    q = torch.randn(b, hkv * groups, d, generator=_gen(bs + 2))
    got = paged_decode_attention(q, pool, v_pool, tables, torch.tensor(lengths, dtype=torch.int32), 0.5, None)
    want = _float64_decode(q, layer_k, layer_v, lengths, 0.5, None)
    assert_close(got, want, what=f"identity-table read, bs {bs}", atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("layer", "bs", "message"),
    [
        (torch.zeros(2, 2, 10, 4), 4, "positive divisor of max_seq_len 10"),
        (torch.zeros(2, 2, 8, 4), 0, "positive divisor"),
        (torch.zeros(2, 8, 2, 4).transpose(1, 2), 4, "layer must be contiguous"),
        (torch.zeros(2, 8, 4), 4, "layer must be [batch, num_kv_heads, max_seq_len, head_dim]"),
    ],
)
def test_contiguous_layer_as_paged_refuses_bad_layers(layer: torch.Tensor, bs: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        contiguous_layer_as_paged(layer, bs)


def _decode_error_cases() -> list:
    q, pool, tables, lens = torch.ones(2, 4, 8), torch.ones(5, 4, 2, 8), torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32)

    def args(**over: object) -> dict:
        base = {"q": q, "k_cache": pool, "v_cache": pool.clone(), "block_tables": tables, "seq_lens": lens, "scale": 0.5, "window": None}
        base.update(over)
        return base

    return [
        pytest.param(args(q=torch.ones(2, 3, 8)), ValueError, "must be a positive multiple of the cache's num_kv_heads", id="gqa"),
        pytest.param(args(q=torch.ones(2, 4, 6)), ValueError, "q has head_dim 6", id="head_dim"),
        pytest.param(args(q=torch.ones(8, 8)), ValueError, "q must be [batch, num_heads, head_dim]", id="q rank"),
        pytest.param(args(k_cache=pool.double()), TypeError, "k_cache has dtype torch.float64", id="cache dtype"),
        pytest.param(args(v_cache=torch.ones(5, 4, 1, 8)), ValueError, "k_cache and v_cache must both be", id="v shape"),
        pytest.param(args(block_tables=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "block_tables must be [batch=2", id="tables"),
        pytest.param(args(block_tables=tables.float()), TypeError, "block_tables must be int32 or int64", id="tables dtype"),
        pytest.param(args(seq_lens=torch.ones(3, dtype=torch.int32)), ValueError, "seq_lens must be [batch=2]", id="lens"),
        pytest.param(args(scale=0.0), ValueError, "scale must be a positive number", id="scale"),
        pytest.param(args(window=0), ValueError, "window must be a positive int or None", id="window 0"),
        pytest.param(args(window=True), ValueError, "window must be a positive int or None", id="window bool"),
        pytest.param(args(seq_lens=lens.to("meta")), ValueError, "seq_lens is on meta", id="device"),
    ]


@pytest.mark.parametrize(("kwargs", "error", "message"), _decode_error_cases())
def test_decode_refuses_bad_arguments(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        paged_decode_attention(**kwargs)


def test_importing_the_kernels_never_warns() -> None:
    """With or without Triton installed: ``-W error`` turns any import-time warning into a failure."""
    code = "import infer_ref, infer_ref.fast.kernels; print(infer_ref.fast.kernels.common.HAVE_TRITON)"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("True", "False")


def test_decode_splits_give_four_waves_but_never_an_empty_tile() -> None:
    """decode_num_splits from its arithmetic: ceil(4 * SMs / (B * Hkv)) programs' worth of splits,
    at most one per 64-key tile of the longest visible range, at least 1, at most 128."""
    from infer_ref.fast.kernels.attention import decode_num_splits

    assert decode_num_splits(1, 8, 4096, 64, 132) == 64  # min(ceil(528 / 8) = 66, 4096 / 64 = 64)
    assert decode_num_splits(1, 8, 16384, 64, 132) == 66  # four waves bind: 66 < 256 tiles
    assert decode_num_splits(1, 8, 100, 64, 132) == 2  # two tiles (the second partial) of 100 keys
    assert decode_num_splits(64, 8, 16384, 64, 132) == 2  # 512 rows x heads already fill four waves
    assert decode_num_splits(1, 1, 1 << 20, 64, 132) == 128  # the cap


def test_programmatic_dependent_launch_is_never_used_off_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels/common.py's PDL helpers: no PDL on the CPU or under the interpreter (neither has griddepcontrol), and
    the Triton launch keyword is passed only with it."""
    from infer_ref.fast.kernels import common as pdl

    cpu = torch.device("cpu")
    assert pdl.pdl_launch(cpu) is False
    assert pdl.pdl_options(cpu) == {"USE_PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.pdl_launch(torch.device("cuda", 0)) is False  # decided before any CUDA query
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv(pdl.ENV_SWITCH, "0")
    assert pdl.pdl_launch(torch.device("cuda", 0)) is False
