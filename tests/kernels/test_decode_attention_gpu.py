"""The fused decode attention kernel on CUDA (``pytest -m gpu tests/kernels/test_decode_attention_gpu.py``).

Every check draws fresh random inputs: q/k/v as views of one packed projection output (a model's
layout: every stride a parameter), prefix K/V scattered into randomly permuted blocks with stale
table entries (``infer_ref.conformance.oracles.paged``), NaN in every slot no row owns, in the slot each row's
new token goes to and (with a window) in every slot before the window, and a NaN-filled output
buffer. The expected values are those of ``decode_attention_reference`` (the torch definitions,
run on the same GPU) on clones of the same inputs.

Tolerances: outputs as documented in ``tests/unit/test_kernels_gpu.py`` (bf16/fp16:
``2e-2 + 2e-2 |ref|``, the kernel rounding the softmax weights to the dtype before the PV product;
fp32: ``1e-5 + 1e-5 |ref|``). Caches: V bitwise, K bitwise without a norm (RoPE's roundings are
reproduced exactly); with a k_norm the kernel's float32 sum of squares (and rsqrt) may round
differently from torch's, which moves a normed element by an ulp, and RoPE then adds two products
that may cancel: the new keys must lie within two ulps at the scale of the head's largest element
(``2 * eps * max|k|``; in float32, where no 16-bit rounding absorbs them, each normed element
carries up to two ulps of its own and RoPE adds two such products and a rounding: ``4 * eps * max|k|``), and in bf16/fp16 at most 1% of their elements may differ from the
reference's bits (a float32 rstd one ulp away moves an element across a 16-bit rounding boundary
with probability ~2**-12 or less; skipping one of the formula's roundings moves a large share);
every other slot bitwise. After every launch the arrival counters are zero.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

from infer_ref.conformance.assertions import assert_close as kit_assert_close
from infer_ref.conformance.oracles.paged import scatter_to_paged
from infer_ref.fast.kernels.attention import (
    contiguous_layer_as_paged,
    decode_attention,
    decode_attention_reference,
    decode_attention_triton,
)
from infer_ref.fast.kernels.attention import launch as attention_launch
from infer_ref.fast.kernels.common import HAVE_TRITON
from infer_ref.norm import NormSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: run `pytest -m gpu` on a GPU machine"),
    pytest.mark.skipif(not HAVE_TRITON, reason="needs Triton (the kernel under test)"),
]

CUDA = "cuda"
# (num_heads, num_kv_heads, head_dim) and the per-head norm of Llama-3.2-1B (GQA 4, none), Qwen3-1.7B
# (GQA 2, Llama's formula) and Gemma-3-1b (GQA 4, one KV head, Gemma's formula; local layers slide 512).
FAMILIES = {"llama": ((32, 8, 64), "none"), "qwen3": ((16, 8, 128), "llama"), "gemma3": ((4, 1, 256), "gemma")}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-2, torch.float32: 1e-5}


def _seed(*what: object) -> int:
    return zlib.crc32(" ".join(map(str, what)).encode())


def normed_key_ulps(dtype: torch.dtype) -> int:
    """Ulps (at the scale of the head's largest element) a normed-and-rotated new key may be off
    (module docstring): 2 in bf16/fp16, 4 in float32."""
    return 4 if dtype == torch.float32 else 2


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN payloads compare equal bitwise, unlike ``==``)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _rope_tables(positions: list[int], d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[len(positions), D]`` as a model builds them (float32 angles, cast)."""
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _norm(kind: str, d: int, dtype: torch.dtype, g: torch.Generator) -> NormSpec | None:
    if kind == "none":
        return None
    if kind == "gemma":
        return NormSpec((0.3 * torch.randn(d, generator=g)).to(dtype).to(CUDA), 1e-6, unit_offset=True)
    return NormSpec((1.0 + 0.3 * torch.randn(d, generator=g)).to(dtype).to(CUDA), 1e-6, unit_offset=False)


def build(
    shape: tuple[int, int, int], norms: str, lengths: list[int], bs: int, dtype: torch.dtype, seed: int,
    *, window: int | None = None, rope: str = "rows", spare_blocks: int = 2,
) -> tuple[dict[str, Any], list[tuple[int, int]]]:  # fmt: skip
    """``decode_attention``'s keyword arguments on CUDA (module docstring) and each row's new slot
    ``(block, offset)``."""
    g = torch.Generator().manual_seed(seed)
    h, hkv, d = shape
    b = len(lengths)
    qkv = (2.0 * torch.randn(b, (h + 2 * hkv) * d, generator=g)).to(dtype).to(CUDA)  # one packed projection output
    prefix_k = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    prefix_v = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    layout = scatter_to_paged(prefix_k, prefix_v, lengths, bs, generator=g, spare_blocks=spare_blocks, stale_entries=2)
    new_slots = []
    for row, n in enumerate(lengths):
        block = int(layout.block_tables[row, (n - 1) // bs])
        new_slots.append((block, (n - 1) % bs))
        layout.k_pool[block, (n - 1) % bs] = float("nan")
        layout.v_pool[block, (n - 1) % bs] = float("nan")
        if window is not None and n > window:  # slots before the window: never read
            for pos in range(n - window):
                blk = int(layout.block_tables[row, pos // bs])
                layout.k_pool[blk, pos % bs] = float("nan")
                layout.v_pool[blk, pos % bs] = float("nan")
    cos = sin = None
    if rope != "none":
        cos, sin = _rope_tables([n - 1 for n in lengths] if rope == "rows" else [lengths[0] - 1], d, dtype)
        cos, sin = cos.to(CUDA), sin.to(CUDA)
    args = {
        "q": qkv[:, : h * d].view(b, h, d), "k": qkv[:, h * d : (h + hkv) * d].view(b, hkv, d),
        "v": qkv[:, (h + hkv) * d :].view(b, hkv, d), "cos": cos, "sin": sin,
        "k_cache": layout.k_pool.to(CUDA), "v_cache": layout.v_pool.to(CUDA),
        "block_tables": layout.block_tables.to(CUDA), "seq_lens": layout.seq_lens.to(CUDA),
        "scale": d**-0.5, "window": window, "q_norm": _norm(norms, d, dtype, g), "k_norm": _norm(norms, d, dtype, g),
    }  # fmt: skip
    return args, new_slots


def _fresh_caches(args: dict[str, Any]) -> dict[str, Any]:
    return dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """``|got - want| <= tol + tol * |want|`` everywhere; a NaN or inf (an unwritten element, a poisoned
    slot read) fails too."""
    kit_assert_close(got, want, what=what, atol=tol, rtol=tol)


def assert_caches_match(got: dict[str, Any], want: dict[str, Any], new_slots: list[tuple[int, int]], what: str) -> None:
    """V pools bitwise, the new values exactly at their slots; K pools bitwise except the new keys
    under a norm (module docstring)."""
    got_v, want_v = got["v_cache"], want["v_cache"]
    diff = (_bits(got_v) != _bits(want_v)).reshape(got_v.shape[0], got_v.shape[1], -1).any(-1)
    assert not diff.any(), f"{what}: V pool differs from the reference at (block, offset) {diff.nonzero().tolist()[:6]}"
    for row, (block, offset) in enumerate(new_slots):
        assert torch.equal(_bits(got_v[block, offset]), _bits(got["v"][row])), f"{what}: row {row}'s new V is not at its slot"
    got_k, want_k = got["k_cache"].clone(), want["k_cache"].clone()
    if got["k_norm"] is not None:
        eps = torch.finfo(got_k.dtype).eps
        differ = total = 0
        for row, (block, offset) in enumerate(new_slots):
            g_, w_ = got_k[block, offset].double(), want_k[block, offset].double()  # [Hkv, D]
            err, bound = (g_ - w_).abs(), normed_key_ulps(got_k.dtype) * eps * w_.abs().amax(-1, keepdim=True)
            assert (err <= bound).all(), f"{what}: row {row}'s new K off by {err.max().item():.3g} (bound {bound.min().item():.3g})"
            differ += int((_bits(got_k[block, offset]) != _bits(want_k[block, offset])).sum())
            total += g_.numel()
            got_k[block, offset] = want_k[block, offset]
        if got_k.element_size() == 2:
            assert differ <= 0.01 * total, f"{what}: {differ} of the {total} new-key elements differ bitwise (at most 1%)"
    diff = (_bits(got_k) != _bits(want_k)).reshape(got_k.shape[0], got_k.shape[1], -1).any(-1)
    assert not diff.any(), f"{what}: K pool differs from the reference at (block, offset) {diff.nonzero().tolist()[:6]}"


def assert_counters_zero(what: str) -> None:
    for (device, size), counters in attention_launch._COUNTERS.items():
        if device.type == "cuda":
            assert not counters.any(), f"{what}: arrival counters ({size} pairs on {device}) not reset: {counters.nonzero().flatten().tolist()[:8]}"


def check(args: dict[str, Any], new_slots: list[tuple[int, int]], what: str, **knobs: Any) -> torch.Tensor:
    """The kernel (NaN-filled output buffer) and the reference on clones of the same inputs."""
    mine, ref = _fresh_caches(args), _fresh_caches(args)
    out = torch.full(args["q"].shape, float("nan"), dtype=args["q"].dtype, device=CUDA)
    got = decode_attention_triton(**mine, out=out, **knobs)
    want = decode_attention_reference(**ref)
    torch.cuda.synchronize()
    assert got is out
    assert_close(got, want, TOLERANCE[args["q"].dtype], what)
    assert_caches_match(mine, ref, new_slots, what)
    assert_counters_zero(what)
    return got


# -- against the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bs", [1, 16, 128])
@pytest.mark.parametrize("num_splits", [None, 7])
def test_family_shapes_at_block_boundaries(family: str, dtype: torch.dtype, bs: int, num_splits: int | None) -> None:
    """Rows of lengths k*bs - 1, k*bs, k*bs + 1 and 1 in one batch, each its own RoPE position, the
    family's per-head norms; the split heuristic and 7 splits (several combine, rows of one split)."""
    shape, norms = FAMILIES[family]
    k = 3 if bs > 1 else 70
    lengths = [k * bs - 1, k * bs, k * bs + 1, 1]
    for seed in range(2):
        args, slots = build(shape, norms, lengths, bs, dtype, _seed(family, dtype, bs, num_splits, seed))
        check(args, slots, f"{family} {dtype} bs={bs} splits={num_splits} seed={seed}", num_splits=num_splits)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("context", [1024, 4096, 16384])
def test_long_contexts(family: str, context: int) -> None:
    """One long row and a short one (bf16, blocks of 16, the split heuristic); Gemma's shape also
    with its 512-key sliding window."""
    shape, norms = FAMILIES[family]
    windows = [None, 512] if family == "gemma3" else [None]
    for window in windows:
        lengths = [context + 13, 77]
        args, slots = build(shape, norms, lengths, 16, torch.bfloat16, _seed(family, context, window), window=window)
        check(args, slots, f"{family} context {context} window {window}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("context", [4096, 16384])
def test_long_contexts_in_every_dtype(dtype: torch.dtype, context: int) -> None:
    shape, norms = FAMILIES["qwen3"]
    args, slots = build(shape, norms, [context, 1000], 128, dtype, _seed("qwen3", dtype, context))
    check(args, slots, f"qwen3 {dtype} context {context}")


@pytest.mark.parametrize("window", [1, 7, 16, 100, 512])
@pytest.mark.parametrize("bs", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_windows(window: int, bs: int, num_splits: int | None) -> None:
    """Windows shorter and longer than the rows (Gemma's shape), crossing block edges; every slot
    before a row's window holds NaN, so a masked full scan would show."""
    shape, norms = FAMILIES["gemma3"]
    lengths = [5, 16, 17, 99, 100, 101, 300, 1000]
    args, slots = build(shape, norms, lengths, bs, torch.bfloat16, _seed(window, bs, num_splits), window=window)
    check(args, slots, f"window {window} bs {bs} splits {num_splits}", num_splits=num_splits)


@pytest.mark.parametrize(("rope", "norms"), [("shared", "llama"), ("none", "gemma"), ("none", "none")])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_other_prep_stages(rope: str, norms: str, dtype: torch.dtype) -> None:
    """One RoPE row shared by every row, no RoPE at all (with and without norms), and a q_norm
    without a k_norm."""
    args, slots = build((16, 8, 128), norms, [33, 64, 65, 1], 16, dtype, _seed(rope, norms, dtype), rope=rope)
    check(args, slots, f"rope {rope} norms {norms} {dtype}", num_splits=4)
    args["k_norm"] = None
    if args["q_norm"] is not None:
        check(args, slots, f"rope {rope} q_norm only {dtype}", num_splits=4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("preload", [False, True])
def test_one_length_broadcast_to_every_row(family: str, preload: bool) -> None:
    """Rows of one length given as a stride-0 view ``lengths[:1].expand(B)`` (what ``pos.expand(B)``
    gives, and what a compiled step may hand the op), over storage whose next elements hold other
    lengths: every row reads the one length, through the tensor's stride."""
    shape, norms = FAMILIES[family]
    args, slots = build(shape, norms, [45, 45, 45], 16, torch.bfloat16, zlib.crc32(f"broadcast {family} {preload}".encode()))
    storage = torch.tensor([45, 2, 9], dtype=args["seq_lens"].dtype, device=CUDA)  # rows 1, 2 must not read 2, 9
    args["seq_lens"] = storage[:1].expand(3)
    check(args, slots, f"{family} one length broadcast, preload {preload}", num_splits=4, preload=preload)


def test_a_static_layer_through_its_identity_view() -> None:
    """A contiguous layer ``[B, Hkv, S, D]`` as its overlapping strided pool view: the new K/V land
    at ``layer[b, :, n - 1]``, nothing else in the layer changes."""
    (h, hkv, d), norms = FAMILIES["qwen3"]
    b, s = 3, 1024
    g = torch.Generator().manual_seed(5)
    lengths = [1, 300, 1024]
    layer_k = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16).to(CUDA)
    layer_v = torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16).to(CUDA)
    for row, n in enumerate(lengths):
        layer_k[row, :, n - 1 :] = float("nan")
        layer_v[row, :, n - 1 :] = float("nan")
    q, k, v = (torch.randn(b, heads, d, generator=g).to(torch.bfloat16).to(CUDA) for heads in (h, hkv, hkv))
    cos, sin = (t.to(CUDA) for t in _rope_tables([n - 1 for n in lengths], d, torch.bfloat16))
    q_norm, k_norm = _norm(norms, d, torch.bfloat16, g), _norm(norms, d, torch.bfloat16, g)
    lens = torch.tensor(lengths, device=CUDA)
    ref_k, ref_v = layer_k.clone(), layer_v.clone()
    pools = [contiguous_layer_as_paged(t, 64) for t in (layer_k, layer_v, ref_k, ref_v)]
    tables = pools[0][1]
    got = decode_attention(q, k, v, cos, sin, pools[0][0], pools[1][0], tables, lens, d**-0.5, None, q_norm, k_norm)
    want = decode_attention_reference(q, k, v, cos, sin, pools[2][0], pools[3][0], tables, lens, d**-0.5, None, q_norm, k_norm)
    assert_close(got, want, TOLERANCE[torch.bfloat16], "identity view")
    assert torch.equal(_bits(layer_v), _bits(ref_v)), "the V layer differs from the reference's"
    for row, n in enumerate(lengths):
        assert torch.equal(layer_v[row, :, n - 1], v[row]), f"row {row}: V not at layer[{row}, :, {n - 1}]"
        same = _bits(layer_k[row]) == _bits(ref_k[row])  # [Hkv, S, D]
        assert same[:, : n - 1].all() and same[:, n:].all(), f"row {row}: K changed outside position {n - 1}"


def test_pool_addresses_past_int32() -> None:
    """Pools of more than 2**31 elements, a row living in the highest blocks: block * stride
    overflows int32 (as it did in the store kernel once)."""
    (h, hkv, d), norms = FAMILIES["qwen3"]
    bs = 16
    num_blocks = 2**31 // (bs * hkv * d) + 64  # 4.3 GB per pool in bf16
    k_pool = torch.empty((num_blocks, bs, hkv, d), dtype=torch.bfloat16, device=CUDA)
    v_pool = torch.empty_like(k_pool)
    small, slots = build((h, hkv, d), norms, [40, 3], bs, torch.bfloat16, 17, spare_blocks=1)
    used = small["k_cache"].shape[0]  # blocks of the small layout, moved to the top of the big pools
    top = num_blocks - used
    k_pool[top:] = small["k_cache"]
    v_pool[top:] = small["v_cache"]
    args = dict(small, k_cache=k_pool, v_cache=v_pool, block_tables=small["block_tables"] + top)
    mine = dict(args)  # in place on the big pools (a clone would need another 8.6 GB)
    got = decode_attention_triton(**mine)
    want = decode_attention_reference(**small)  # the same contents at low ids
    torch.cuda.synchronize()
    assert_close(got, want, TOLERANCE[torch.bfloat16], "pool past 2**31 elements")
    for row, (block, offset) in enumerate(slots):
        assert torch.equal(v_pool[top + block, offset], small["v"][row]), f"row {row}'s new V is not at block {top + block}"
    assert torch.equal(_bits(v_pool[top:]), _bits(small["v_cache"])), "the top blocks differ from the reference's"


# -- determinism, graphs, PDL, compile ---------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_launches_are_bitwise_identical(family: str) -> None:
    """Whichever split arrives last combines in split order: ten launches on the same inputs
    (fresh cache clones) give the same bits."""
    shape, norms = FAMILIES[family]
    args, _ = build(shape, norms, [4096, 2000, 37], 16, torch.bfloat16, _seed("determinism", family))
    outs = [decode_attention_triton(**_fresh_caches(args), num_splits=64) for _ in range(10)]
    torch.cuda.synchronize()
    for i, out in enumerate(outs[1:], 1):
        assert torch.equal(_bits(out), _bits(outs[0])), f"launch {i} differs from launch 0"


def test_graph_replays_a_decode_loop() -> None:
    """One capture, replayed as a decode loop: each replay appends one token per row (lengths grow
    on the device, fresh q/k/v and RoPE rows), so each replay also reads what the previous one
    stored. The reference runs the same loop eagerly on its own copy of the caches."""
    shape, norms = FAMILIES["qwen3"]
    start = [5, 130, 700]
    args, _ = build(shape, norms, [n + 40 for n in start], 16, torch.bfloat16, 23)  # room to grow
    args["seq_lens"] = torch.tensor(start, dtype=torch.int32, device=CUDA)
    static = _fresh_caches(args)  # the graph's buffers
    ref = _fresh_caches(args)
    decode_attention(**static)  # compiles and allocates the counters outside the capture
    torch.cuda.synchronize()
    for name in ("k_cache", "v_cache"):  # undo that warm-up's write
        static[name].copy_(args[name])
    static["seq_lens"].copy_(torch.tensor(start, dtype=torch.int32))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(**static)
    d = shape[2]
    for step in range(6):
        lengths = [n + step for n in start]
        g = torch.Generator().manual_seed(100 + step)
        for name in ("q", "k", "v"):
            static[name].copy_(torch.randn(static[name].shape, generator=g).to(torch.bfloat16))
        cos, sin = _rope_tables([n - 1 for n in lengths], d, torch.bfloat16)
        static["cos"].copy_(cos)
        static["sin"].copy_(sin)
        static["seq_lens"].copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        want = decode_attention_reference(**dict(ref, q=static["q"], k=static["k"], v=static["v"], cos=static["cos"], sin=static["sin"], seq_lens=static["seq_lens"].clone()))
        torch.cuda.synchronize()
        assert_close(out, want, TOLERANCE[torch.bfloat16], f"replay {step}, lengths {lengths}")
        assert torch.equal(_bits(static["v_cache"]), _bits(ref["v_cache"])), f"replay {step}: V caches differ"
        assert_counters_zero(f"replay {step}")


def test_graph_replays_with_lengths_changed_anyhow() -> None:
    """Lengths jump between replays (shorter, longer, one split, many): the splits are fixed at
    capture, each program finds its share on the device."""
    shape, norms = FAMILIES["llama"]
    capacity = 40 * 16
    args, _ = build(shape, norms, [capacity, capacity], 16, torch.bfloat16, 29)
    static = _fresh_caches(args)
    decode_attention(**_fresh_caches(args))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(**static)
    for step, lengths in enumerate(([5, 9], [17, 1], [640, 333], [129, 640], [64, 65])):
        before = _fresh_caches(static)
        static["seq_lens"].copy_(torch.tensor(lengths, dtype=torch.int32))
        static["q"].copy_(torch.randn(static["q"].shape, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16))
        graph.replay()
        want = decode_attention_reference(**dict(before, seq_lens=static["seq_lens"].clone()))
        torch.cuda.synchronize()
        assert_close(out, want, TOLERANCE[torch.bfloat16], f"replay {step} with lengths {lengths}")
        assert torch.equal(_bits(static["v_cache"]), _bits(before["v_cache"])), f"replay {step}: V caches differ"
        assert_counters_zero(f"replay {step}")


def test_graph_of_chained_layers_sharing_counters() -> None:
    """Eight launches in one graph, each layer's query the previous layer's output, all sharing one
    set of arrival counters (one batch size): with programmatic dependent launch a layer may start
    while the previous drains, so this holds only if every program waits for its predecessor
    before reading q or the counters (kernels/common.py) and each launch resets the counters."""
    shape, norms = FAMILIES["llama"]
    layers = [build(shape, norms, [3000, 777, 64], 16, torch.bfloat16, _seed("chain", i))[0] for i in range(8)]
    static = [_fresh_caches(a) for a in layers]
    q0 = static[0]["q"].clone()

    def chain() -> list[torch.Tensor]:
        outs, q = [], q0
        for a in static:
            q = decode_attention_triton(**dict(a, q=q), num_splits=32)
            outs.append(q)
        return outs

    chain()  # warm-up: compile, allocate the counters
    torch.cuda.synchronize()
    for a, src in zip(static, layers, strict=True):  # undo the warm-up's writes
        a["k_cache"].copy_(src["k_cache"])
        a["v_cache"].copy_(src["v_cache"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain()
    for replay in range(3):
        refs = [_fresh_caches(a) for a in static]  # the state this replay starts from
        graph.replay()
        q = q0
        for i, ref in enumerate(refs):
            want = decode_attention_reference(**dict(ref, q=q))
            assert_close(outs[i], want, TOLERANCE[torch.bfloat16], f"replay {replay}, layer {i}")
            q = outs[i]  # the next layer reads what the kernel wrote, as in the graph
        torch.cuda.synchronize()
        assert_counters_zero(f"replay {replay}")


# -- heads per program: the whole group on tensor cores, or parts of it as multiply-and-sums ----------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("preload", [False, True])
def test_every_heads_per_program(family: str, dtype: torch.dtype, preload: bool) -> None:
    """Each divisor of the family's group as the heads a program takes (the whole group: tensor
    cores; fewer: multiply-and-sums, several programs per KV head, one of them storing the new
    K/V), at block boundaries, a row of one token and long rows (several splits combining), the
    split heuristic and 5 splits, preloading and not; Gemma's shape also with its sliding window."""
    shape, norms = FAMILIES[family]
    group = shape[0] // shape[1]
    lengths = [47, 48, 49, 1, 300, 2000]
    for heads in [h for h in range(1, group + 1) if group % h == 0]:
        for window in [None, 512] if family == "gemma3" else [None]:
            seed = _seed("heads", family, dtype, preload, heads, window)
            args, slots = build(shape, norms, lengths, 16, dtype, seed, window=window)
            what = f"{family} {dtype} heads_per_program={heads} preload={preload} window={window}"
            check(args, slots, what, heads_per_program=heads, preload=preload)
            check(args, slots, what + " splits=5", heads_per_program=heads, preload=preload, num_splits=5)


# -- the preload: each split's first tile read before the dependency wait ----------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("larger_first_tile", [False, True])
@pytest.mark.parametrize("bs", [1, 16])
def test_preloading_launches_equal_the_reference(family: str, dtype: torch.dtype, larger_first_tile: bool, bs: int) -> None:
    """The decode steps' launch (``preload=True``) at block boundaries, with one row past one
    split's first tile and one long row (several splits, each with a preloaded first tile and
    tiles after it), the tile table's first tiles and larger ones (128 keys; 64 for Gemma's head
    dim of 256, whose float32 tile of 128 keys does not fit an H100 block's shared memory); Gemma's
    shape also with its sliding window."""
    shape, norms = FAMILIES[family]
    first_n = (64 if shape[2] == 256 else 128) if larger_first_tile else None
    k = 3 if bs > 1 else 70
    lengths = [k * bs - 1, k * bs, k * bs + 1, 1, 300, 2000]
    for window in [None, 512] if family == "gemma3" else [None]:
        args, slots = build(shape, norms, lengths, bs, dtype, _seed("preload", family, dtype, first_n, bs, window), window=window)
        what = f"preload {family} {dtype} first_n={first_n} bs={bs} window={window}"
        check(args, slots, what, preload=True, first_n=first_n)
        check(args, slots, what + " splits=5", preload=True, first_n=first_n, num_splits=5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_preload_after_a_kernel_writing_lengths_and_tables(family: str) -> None:
    """In one captured graph, each layer's preloading launch comes right after a copy kernel that
    writes the lengths and the block tables it reads (as a cache updating them just before the
    step would): the values the preload saw before its wait may be the old ones, and each replay
    changes both (other lengths, the rows' blocks relabelled). Every output equals the reference's
    on the new lengths and tables."""
    shape, norms = FAMILIES[family]
    layers = 6
    base, _ = build(shape, norms, [900, 1500, 40], 16, torch.bfloat16, _seed("preload chain", family))
    pools = [_fresh_caches(base) for _ in range(layers)]
    num_blocks = base["k_cache"].shape[0]
    static_lens = base["seq_lens"].clone()
    static_tables = base["block_tables"].clone()
    next_lens, next_tables = static_lens.clone(), static_tables.clone()  # what the copies write

    def chain() -> list[torch.Tensor]:
        outs = []
        for p in pools:
            static_lens.copy_(next_lens)  # the kernel right before each launch writes its lengths...
            static_tables.copy_(next_tables)  # ...and its table
            outs.append(decode_attention_triton(**dict(p, seq_lens=static_lens, block_tables=static_tables), preload=True))
        return outs

    chain()  # compiles, allocates the counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain()
    g = torch.Generator().manual_seed(_seed("relabel", family))
    for replay, lengths in enumerate(([901, 1500, 41], [300, 1501, 1], [902, 17, 42])):
        relabel = torch.randperm(num_blocks, generator=g).to(CUDA)  # a new physical home for every block
        for p in pools:  # move the contents so the relabelled tables point at them
            for name in ("k_cache", "v_cache"):
                moved = torch.empty_like(p[name])
                moved[relabel] = p[name]
                p[name].copy_(moved)
        new_tables = relabel[next_tables.long()].to(next_tables.dtype)
        next_tables.copy_(new_tables)
        next_lens.copy_(torch.tensor(lengths, dtype=next_lens.dtype))
        refs = [_fresh_caches(dict(p, seq_lens=next_lens.clone(), block_tables=new_tables.clone())) for p in pools]
        graph.replay()
        for i, ref in enumerate(refs):
            want = decode_attention_reference(**ref)
            assert_close(outs[i], want, TOLERANCE[torch.bfloat16], f"{family} replay {replay} layer {i} lengths {lengths}")
            assert torch.equal(_bits(pools[i]["v_cache"]), _bits(ref["v_cache"])), f"replay {replay} layer {i}: V caches differ"
        torch.cuda.synchronize()
        assert_counters_zero(f"{family} replay {replay}")


def test_first_call_of_a_shape_inside_a_capture_is_refused() -> None:
    """The counters are allocated by the first call of a (device, B * Hkv): inside a capture that
    would leave them uninitialised outside the graph, so it is refused with a clear error."""
    shape, norms = FAMILIES["gemma3"]
    b = 13  # a batch size no other test uses: its counters do not exist yet
    args, _ = build(shape, norms, [300] * b, 16, torch.bfloat16, 31)
    attention_launch._COUNTERS.pop((torch.device(CUDA, torch.cuda.current_device()), b), None)
    attention_launch._COUNTERS.pop((torch.device(CUDA), b), None)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), pytest.raises(RuntimeError, match="call it once before capturing"):
        decode_attention_triton(**args, num_splits=4)


@pytest.mark.parametrize("through_a_layer_view", [False, True])
def test_compiled_fullgraph_writes_the_cache_in_place(through_a_layer_view: bool) -> None:
    """``torch.compile(fullgraph=True)``: the op is one node that writes the pool it is given (the
    output and the cache as the reference's), and no copy of the pool is made: the peak memory of
    the compiled call stays far below one pool. Also with the pool a layer's view of an
    ``[L, num_blocks, bs, Hkv, D]`` buffer, taken inside the compiled function."""
    shape, norms = FAMILIES["llama"]
    args, slots = build(shape, norms, [2000, 513], 16, torch.bfloat16, _seed("compile", through_a_layer_view), spare_blocks=2000)
    if through_a_layer_view:  # [3, num_blocks, ...]: the layer is index 1
        k_all = torch.stack([torch.zeros_like(args["k_cache"]), args["k_cache"], torch.zeros_like(args["k_cache"])])
        v_all = torch.stack([torch.zeros_like(args["v_cache"]), args["v_cache"], torch.zeros_like(args["v_cache"])])

        def step(q, k, v, cos, sin, k_all, v_all, tables, lens):  # type: ignore[no-untyped-def]
            return decode_attention(q, k, v, cos, sin, k_all[1], v_all[1], tables, lens, 0.125)

        fn = torch.compile(step, fullgraph=True)
        call = lambda: fn(args["q"], args["k"], args["v"], args["cos"], args["sin"], k_all, v_all, args["block_tables"], args["seq_lens"])  # noqa: E731
        k_pool, v_pool = k_all[1], v_all[1]
        pool_bytes = k_all.numel() * 2 // 3
    else:
        k_pool, v_pool = args["k_cache"], args["v_cache"]
        fn = torch.compile(decode_attention, fullgraph=True)
        call = lambda: fn(args["q"], args["k"], args["v"], args["cos"], args["sin"], k_pool, v_pool, args["block_tables"], args["seq_lens"], 0.125)  # noqa: E731
        pool_bytes = k_pool.numel() * 2
    ref = dict(_fresh_caches(dict(args, k_cache=k_pool, v_cache=v_pool)), scale=0.125)
    want = decode_attention_reference(**ref)
    call()  # compiles; writes the same K/V to the same slots as the measured call (which never reads them)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    got = call()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < pool_bytes // 4, f"the compiled call allocated {extra} bytes: a copy of the {pool_bytes}-byte pool?"
    assert_close(got, want, TOLERANCE[torch.bfloat16], f"compiled, layer view {through_a_layer_view}")
    for row, (block, offset) in enumerate(slots):
        assert torch.equal(v_pool[block, offset], args["v"][row]), f"row {row}'s new V was not written in place"
    assert torch.equal(_bits(v_pool), _bits(ref["v_cache"])), "the compiled call's V cache differs from the reference's"
    assert_counters_zero("compiled")
