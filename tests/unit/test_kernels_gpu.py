"""Triton kernels against their torch references, on CUDA (``pytest -m gpu``).

Every check draws fresh random inputs and poisons what a missed or stray write would show: caches
and pools are NaN-filled before a store, the tail of a row's last block, spare blocks and the
blocks that stale table entries point at hold NaN, and outputs start as NaN where the kernel
writes into a given tensor.

Tolerances (decode): the reference computes in float32 and rounds once to the output dtype; the
kernel also accumulates in float32 but rounds the softmax weights to the input dtype before the
PV product (as flash attention does), so in bf16/fp16 the two may differ by a few output ulps:
``|kernel - reference| <= 2e-2 + 2e-2 * |reference|`` (bf16 ulp 2**-8 = 0.0039). In float32 both
run IEEE float32 products and agree to ``1e-5 + 1e-5 * |reference|``.
"""

from __future__ import annotations

import pytest
import torch

from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys
from infer_ref.conformance.oracles.paged import PagedLayout, scatter_to_paged, to_device
from infer_ref.fast.kernels.attention import (
    contiguous_layer_as_paged,
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from infer_ref.fast.kernels.common import HAVE_TRITON
from infer_ref.fast.kernels.store import store_kvcache, store_kvcache_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_TRITON, reason="needs Triton (the kernels under test)"),
]

CUDA = "cuda"
# (num_heads, num_kv_heads, head_dim): Llama-3.2-1B (GQA 4), Qwen3-1.7B (GQA 2), Gemma-3-1b (GQA 4, one KV head).
FAMILY_SHAPES = {"llama": (32, 8, 64), "qwen3": (16, 8, 128), "gemma3": (4, 1, 256)}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-2, torch.float32: 1e-5}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN payloads compare equal bitwise, unlike ``==``)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    diff = (_bits(got) != _bits(want)).reshape(got.shape[0], got.shape[1], -1).any(-1)
    where = diff.nonzero().tolist()
    assert not where, f"{what}: {len(where)} rows differ bitwise from the reference, first (outer, inner) {where[:5]}"


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert torch.isfinite(got).all(), f"{what}: non-finite output (a poisoned slot was read)"
    err = (got.float() - want.float()).abs()
    bound = tol + tol * want.float().abs()
    worst = (err - bound).flatten().argmax()
    assert (err <= bound).all(), (
        f"{what}: max |diff| {err.max().item():.3g} over tolerance {tol} (+rel) at flat index {worst.item()}: "
        f"got {got.flatten()[worst].item()}, reference {want.flatten()[worst].item()}"
    )


# -- store ---------------------------------------------------------------------------------------


def _store_case(n: int, hkv: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-contiguous k/v ``[n, Hkv, D]`` (views into a packed qkv buffer, as a model produces them)."""
    g = _gen(seed)
    qkv = torch.randn(n, 3, hkv, d, generator=g).to(dtype).to(CUDA)
    return qkv[:, 1], qkv[:, 2]


def _run_both_stores(k, v, k_cache, v_cache, slots):  # type: ignore[no-untyped-def]
    """Kernel and reference on clones of the same poisoned caches; returns both pairs."""
    kk, kv_ = k_cache.clone(), v_cache.clone()
    rk, rv = k_cache.clone(), v_cache.clone()
    store_kvcache(k, v, kk, kv_, slots)
    store_kvcache_reference(k, v, rk, rv, slots)
    torch.cuda.synchronize()
    return (kk, kv_), (rk, rv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_store_kernel_paged_pool_bitwise(dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    for seed in range(3):
        num_blocks, bs, hkv, d = 9, 16, 8, 64
        n = 40
        k, v = _store_case(n, hkv, d, dtype, seed)
        g = _gen(100 + seed)
        slots = torch.randperm(num_blocks * bs - 1, generator=g)[:n]  # never the last slot...
        slots[torch.randperm(n, generator=g)[:7]] = -1  # ...which -1 must not reach
        pool = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype, device=CUDA)
        (kk, kv_), (rk, rv) = _run_both_stores(k, v, pool, pool.clone(), slots.to(slot_dtype).to(CUDA))
        _assert_bitwise_equal(kk, rk, f"K pool, seed {seed}")
        _assert_bitwise_equal(kv_, rv, f"V pool, seed {seed}")
        assert torch.isnan(kk[-1, -1]).all() and torch.isnan(kv_[-1, -1]).all(), "slot -1 wrote the last slot"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_store_kernel_strided_contiguous_layer_bitwise(dtype: torch.dtype) -> None:
    b, hkv, s, d = 3, 4, 50, 128
    for seed in range(3):
        g = _gen(seed)
        layer_k = torch.full((b, hkv, s, d), float("nan"), dtype=dtype, device=CUDA)
        layer_v = layer_k.clone()
        # row r writes positions [start_r, start_r + count) at slot r * S + pos; one row pads with -1.
        starts, count = torch.randint(0, s - 6, (b,), generator=g).tolist(), 6
        slots = torch.tensor([r * s + starts[r] + i for r in range(b) for i in range(count)])
        slots[count : 2 * count] = -1
        k, v = _store_case(b * count, hkv, d, dtype, seed)
        (kk, kv_), (rk, rv) = _run_both_stores(
            k, v, layer_k.permute(0, 2, 1, 3), layer_v.permute(0, 2, 1, 3), slots.to(CUDA)
        )
        _assert_bitwise_equal(kk, rk, f"K layer viewed [B, S, Hkv, D], seed {seed}")
        _assert_bitwise_equal(kv_, rv, f"V layer viewed [B, S, Hkv, D], seed {seed}")
        # and the clones of the view wrote to [b, :, pos, :] of a real layer:
        for r in (0, 2):
            pos = starts[r]
            assert torch.equal(kk[r, pos], k[r * count]), f"row {r} position {pos} was not written"


def test_store_kernel_addresses_past_int32() -> None:
    """A pool of more than 2**31 elements: slot * stride overflows int32 (a shipped bug)."""
    bs, hkv, d = 16, 8, 128
    num_blocks = 2**31 // (bs * hkv * d) + 64  # 4.3 GB per pool in bf16
    k_pool = torch.empty((num_blocks, bs, hkv, d), dtype=torch.bfloat16, device=CUDA)
    v_pool = torch.empty_like(k_pool)
    last_slots = torch.arange(num_blocks * bs - 5, num_blocks * bs, device=CUDA)
    first_slots = torch.arange(0, 3, device=CUDA)
    slots = torch.cat([first_slots, last_slots])
    k, v = _store_case(slots.numel(), hkv, d, torch.bfloat16, 7)
    for pool in (k_pool, v_pool):  # poison exactly the rows we will check
        pool[0, :3].fill_(float("nan"))
        pool[-1].fill_(float("nan"))
    store_kvcache(k, v, k_pool, v_pool, slots)
    torch.cuda.synchronize()
    assert torch.equal(k_pool[0, :3], k[:3]) and torch.equal(v_pool[0, :3], v[:3])
    assert torch.equal(k_pool[-1, -5:], k[3:]) and torch.equal(v_pool[-1, -5:], v[3:])
    assert torch.isnan(k_pool[-1, : bs - 5]).all(), "a write landed on an unmapped slot of the last block"


def test_store_kernel_under_cuda_graph_capture() -> None:
    num_blocks, bs, hkv, d, n = 6, 16, 8, 64, 12
    pool_k = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=torch.bfloat16, device=CUDA)
    pool_v = pool_k.clone()
    k = torch.zeros(n, hkv, d, dtype=torch.bfloat16, device=CUDA)
    v = torch.zeros_like(k)
    slots = torch.full((n,), -1, dtype=torch.int64, device=CUDA)
    store_kvcache(k, v, pool_k, pool_v, slots)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_kvcache(k, v, pool_k, pool_v, slots)
    for seed in range(3):
        g = _gen(seed)
        new_slots = torch.randperm(num_blocks * bs, generator=g)[:n]
        new_slots[0] = -1
        new_k, new_v = _store_case(n, hkv, d, torch.bfloat16, seed)
        want_k, want_v = pool_k.clone(), pool_v.clone()
        store_kvcache_reference(new_k, new_v, want_k, want_v, new_slots.to(CUDA))
        k.copy_(new_k)
        v.copy_(new_v)
        slots.copy_(new_slots)
        graph.replay()
        torch.cuda.synchronize()
        _assert_bitwise_equal(pool_k, want_k, f"K after replay {seed}")
        _assert_bitwise_equal(pool_v, want_v, f"V after replay {seed}")


# -- paged decode attention ----------------------------------------------------------------------


def _decode_case(
    shape: tuple[int, int, int], lengths: list[int], bs: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, PagedLayout]:
    h, hkv, d = shape
    g = _gen(seed)
    longest = max(lengths)
    k = torch.randn(len(lengths), hkv, longest, d, generator=g).to(dtype)
    v = torch.randn(len(lengths), hkv, longest, d, generator=g).to(dtype)
    q = torch.randn(len(lengths), h, d, generator=g).to(dtype)
    layout = scatter_to_paged(k, v, lengths, bs, generator=g, spare_blocks=3, stale_entries=2)
    return q.to(CUDA), to_device(layout, CUDA)


def _check_decode(
    q: torch.Tensor, layout: PagedLayout, scale: float, window: int | None, what: str, num_splits: int | None = None
) -> None:
    args = (q, layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens, scale, window)
    if num_splits is None:
        got = paged_decode_attention(*args)
    else:
        got = paged_decode_attention_triton(*args, num_splits=num_splits)
    want = paged_decode_attention_reference(*args)
    torch.cuda.synchronize()
    _assert_close(got, want, TOLERANCE[q.dtype], what)


@pytest.mark.parametrize("family", sorted(FAMILY_SHAPES))
@pytest.mark.parametrize("bs", [1, 16, 128])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_decode_kernel_block_boundaries(family: str, bs: int, num_splits: int | None) -> None:
    """Rows of lengths k*bs - 1, k*bs, k*bs + 1 in one batch, on permuted blocks with stale entries."""
    shape = FAMILY_SHAPES[family]
    blocks = 3 if bs > 1 else 40
    lengths = [blocks * bs - 1, blocks * bs, blocks * bs + 1, 1]
    for seed in range(2):
        q, layout = _decode_case(shape, lengths, bs, torch.bfloat16, seed)
        _check_decode(q, layout, shape[2] ** -0.5, None, f"{family} bs={bs} splits={num_splits} seed={seed}", num_splits)


@pytest.mark.parametrize("family", sorted(FAMILY_SHAPES))
def test_decode_kernel_long_context(family: str) -> None:
    shape = FAMILY_SHAPES[family]
    q, layout = _decode_case(shape, [4096 + 37], 16, torch.bfloat16, 11)
    _check_decode(q, layout, shape[2] ** -0.5, None, f"{family} length 4133")
    _check_decode(q, layout, shape[2] ** -0.5, 512, f"{family} length 4133, window 512")


@pytest.mark.parametrize("window", [1, 7, 16, 100, 512])
@pytest.mark.parametrize("bs", [1, 16])
def test_decode_kernel_windows(window: int, bs: int) -> None:
    """Windows smaller and larger than the lengths (Gemma-3's shape), crossing block edges."""
    shape = FAMILY_SHAPES["gemma3"]
    lengths = [5, 16, 17, 99, 100, 101, 300]
    q, layout = _decode_case(shape, lengths, bs, torch.bfloat16, window * 31 + bs)
    _check_decode(q, layout, 256**-0.5, window, f"window {window} bs {bs}")
    _check_decode(q, layout, 256**-0.5, window, f"window {window} bs {bs}, 3 splits", num_splits=3)


def test_decode_kernel_window_reads_only_the_window() -> None:
    """Keys before the window hold NaN: a masked full scan would read them (0 * NaN = NaN)."""
    shape = FAMILY_SHAPES["gemma3"]
    q, layout = _decode_case(shape, [200, 64], 16, torch.bfloat16, 5)
    window = 50
    for row, n in enumerate((200, 64)):
        for pos in range(n - window):
            block = int(layout.block_tables[row, pos // 16])
            layout.k_pool[block, pos % 16] = float("nan")
            layout.v_pool[block, pos % 16] = float("nan")
    args = (q, layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens, 256**-0.5, window)
    got = paged_decode_attention(*args)
    want = paged_decode_attention_reference(*args)
    _assert_close(got, want, TOLERANCE[torch.bfloat16], "window 50 with NaN before the window")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_decode_kernel_other_dtypes(dtype: torch.dtype) -> None:
    shape = FAMILY_SHAPES["qwen3"]
    q, layout = _decode_case(shape, [47, 48, 49, 700], 16, dtype, 3)
    _check_decode(q, layout, 128**-0.5, None, f"{dtype}")
    _check_decode(q, layout, 128**-0.5, 33, f"{dtype} window 33")


@pytest.mark.parametrize("family", sorted(FAMILY_SHAPES))
@pytest.mark.parametrize("bs", [16, 64])
def test_decode_kernel_reads_a_contiguous_layer_through_an_identity_table(family: str, bs: int) -> None:
    """A static cache layer [B, Hkv, S, D] read in place; expected: float64 attention over it."""
    h, hkv, d = FAMILY_SHAPES[family]
    b, s = 3, 256
    g = _gen(bs)
    lengths = [1, 130, 256]
    layer_k = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16)
    layer_v = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16)
    for row, n in enumerate(lengths):  # unwritten positions of a static cache
        layer_k[row, :, n:] = float("nan")
        layer_v[row, :, n:] = float("nan")
    q = torch.randn(b, h, d, generator=g).to(torch.bfloat16)
    k_pool, tables = contiguous_layer_as_paged(layer_k.to(CUDA), bs)
    v_pool, _ = contiguous_layer_as_paged(layer_v.to(CUDA), bs)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=CUDA)
    got = paged_decode_attention(q.to(CUDA), k_pool, v_pool, tables, seq_lens, d**-0.5).cpu()
    for row, n in enumerate(lengths):
        want = naive_attention(
            q[row][None, :, None], layer_k[row : row + 1, :, :n], layer_v[row : row + 1, :, :n],
            visible_keys(1, n - 1, None), d**-0.5,
        )[0, :, 0]  # fmt: skip
        _assert_close(got[row], want, TOLERANCE[torch.bfloat16], f"{family} bs={bs} row {row} (length {n})")


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("window", [None, 100])
def test_contiguous_layer_read_in_place_reads_only_the_prefix_eager_and_compiled(compiled: bool, window: int | None) -> None:
    """A contiguous layer read in place through identity block tables (``contiguous_layer_as_paged``,
    64-position blocks, as the decode step reads a static cache's layer) by the paged op, called as
    is and from inside ``torch.compile``: NaN in every unwritten slot, float64 attention as the oracle."""
    h, hkv, d = FAMILY_SHAPES["llama"]
    b, s = 2, 1024
    g = _gen(17 + (window or 0))
    lengths = [300, 1024]
    layer_k = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16)
    layer_v = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16)
    for row, n in enumerate(lengths):
        layer_k[row, :, n:] = float("nan")
        layer_v[row, :, n:] = float("nan")
    q = torch.randn(b, h, d, generator=g).to(torch.bfloat16)
    fn = paged_decode_attention
    if compiled:
        fn = torch.compile(paged_decode_attention, fullgraph=True)  # the op is one node: no graph break
    seq_lens = torch.tensor(lengths, dtype=torch.int64, device=CUDA)
    k_pool, tables = contiguous_layer_as_paged(layer_k.to(CUDA), 64)  # strided views of the layers: no copy
    v_pool, _ = contiguous_layer_as_paged(layer_v.to(CUDA), 64)
    got = fn(q.to(CUDA), k_pool, v_pool, tables, seq_lens, d**-0.5, window).cpu()
    for row, n in enumerate(lengths):
        want = naive_attention(
            q[row][None, :, None], layer_k[row : row + 1, :, :n], layer_v[row : row + 1, :, :n],
            visible_keys(1, n - 1, window), d**-0.5,
        )[0, :, 0]  # fmt: skip
        _assert_close(got[row], want, TOLERANCE[torch.bfloat16], f"compiled={compiled} window={window} row {row}")


def test_decode_kernel_replays_in_a_cuda_graph_after_seq_lens_change() -> None:
    shape = FAMILY_SHAPES["llama"]
    d = shape[2]
    bs, capacity_blocks = 16, 40
    q, layout = _decode_case(shape, [capacity_blocks * bs] * 2, bs, torch.bfloat16, 21)
    seq_lens = torch.tensor([5, 9], dtype=torch.int32, device=CUDA)
    args = (q, layout.k_pool, layout.v_pool, layout.block_tables, seq_lens, d**-0.5)
    paged_decode_attention(*args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(*args)
    for step, new_lens in enumerate(([5, 9], [17, 1], [640, 333], [129, 640])):
        seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))  # lengths change on the device only
        q.copy_(torch.randn(q.shape, generator=_gen(step)).to(q.dtype))
        graph.replay()
        want = paged_decode_attention_reference(*args)
        torch.cuda.synchronize()
        _assert_close(out, want, TOLERANCE[torch.bfloat16], f"replay {step} with seq_lens {new_lens}")


def test_decode_kernel_output_is_every_row_and_head() -> None:
    """Batch > 1 with GQA: every (row, head) of the output is written (none left from empty_like)."""
    shape = FAMILY_SHAPES["qwen3"]
    q, layout = _decode_case(shape, [3, 1, 250, 17, 64], 16, torch.bfloat16, 8)
    _check_decode(q, layout, 0.1, None, "batch of 5, scale 0.1")
