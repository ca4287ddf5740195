"""The fused decode attention kernel on a CPU, under Triton's interpreter, against its torch reference.

    TRITON_INTERPRET=1 pytest -p no:cacheprovider -n 2 -q tests/kernels/test_decode_attention_interpret.py -m interpret

Each check draws fresh inputs: q/k/v as views of one packed projection output (so every stride is
a parameter), prefix K/V scattered into randomly permuted blocks with stale table entries
(``infer_ref.conformance.oracles.paged``), NaN in every slot no row owns, in the slot each row's new token goes
to, and (with a window) in every slot before the window; the output buffer starts as NaN. Then:

- the output is finite and within the tolerance of ``tests/unit/test_kernels_gpu.py`` of the
  reference (float32: ``1e-5 + 1e-5 |ref|``; float16: ``2e-2 + 2e-2 |ref|``, the kernel rounding
  the softmax weights to the dtype before the PV product);
- the pools equal the reference's bit for bit, except the new keys when a k_norm is applied: the
  kernel's float32 sum of squares may round differently from torch's (another order), which may
  move the normed key by an ulp; RoPE then adds two products that may cancel, so the bound is two
  ulps at the scale of the head's largest element (``2 * eps * max|k|``; in float32, where no 16-bit rounding absorbs them, each normed element
carries up to two ulps of its own and RoPE adds two such products and a rounding: ``4 * eps * max|k|``), and in float16 at most
  1% of those elements may differ from the reference's bits. Everything else (the new values, keys
  without a norm, every other slot, NaN payloads included) is compared bitwise;
- the arrival counters are back to zero.

Float16 and float32 only: the interpreter converts float32 to bfloat16 by truncation and misreads
bfloat16 ``tl.dot`` operands (bf16 is checked on the GPU, ``test_decode_attention_gpu.py``).

One more ``interpret`` test runs when Triton is importable and ``TRITON_INTERPRET`` is not set: the
kernel compiled ahead of time for an H100 (sm_90) in the configurations the model shapes launch,
checking shared memory and, in the PTX, the memory-ordering pieces the GPU relies on.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from infer_ref.conformance.assertions import assert_close as kit_assert_close
from infer_ref.conformance.oracles.paged import scatter_to_paged
from infer_ref.fast.kernels.attention import (
    AttentionCall,
    LaunchKnobs,
    contiguous_layer_as_paged,
    decode_attention_reference,
    decode_attention_triton,
    default_tile,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from infer_ref.fast.kernels.attention import kernel as attention_kernel
from infer_ref.fast.kernels.attention import launch as attention_launch
from infer_ref.fast.kernels.attention.kernel import NORM_GEMMA, NORM_LLAMA, NORM_NONE
from infer_ref.fast.kernels.common import HAVE_TRITON, DeviceProfile
from infer_ref.norm import NormSpec

interpret = pytest.mark.interpret
needs_interpreter = pytest.mark.skipif(
    not (HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"),
    reason="runs the Triton kernel on CPU: set TRITON_INTERPRET=1 with Triton installed",
)
TOLERANCE = {torch.float16: 2e-2, torch.float32: 1e-5}
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]


def normed_key_ulps(dtype: torch.dtype) -> int:
    """Ulps (at the scale of the head's largest element) a normed-and-rotated new key may be off
    (module docstring): 2 in bf16/fp16, 4 in float32."""
    return 4 if dtype == torch.float32 else 2


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN payloads compare equal bitwise, unlike ``==``)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@dataclass(frozen=True)
class Case:
    """One launch: shapes ``(H, Hkv, D)``, row lengths after the new token, block size, window,
    norms (``"none"``, ``"llama"``, ``"gemma"``, ``"q_only"``: a q_norm without a k_norm), RoPE
    tables (``"rows"`` ``[B, D]``, ``"shared"`` ``[1, D]``, ``"none"``), splits, keys per tile, query
    heads per program (None: the tiling's; the whole group: tensor-core products; a part of it:
    multiply-and-sums)."""

    shape: tuple[int, int, int]
    lengths: tuple[int, ...]
    bs: int
    window: int | None = None
    norms: str = "none"
    rope: str = "rows"
    splits: int | None = 3
    block_n: int = 16
    heads: int | None = None

    def __str__(self) -> str:
        h, hkv, d = self.shape
        return (
            f"H{h}-Hkv{hkv}-D{d}-len{'_'.join(map(str, self.lengths))}-bs{self.bs}-w{self.window}-"
            f"{self.norms}-rope_{self.rope}-splits{self.splits}-heads{self.heads}"
        )


@dataclass
class Inputs:
    args: dict[str, Any]  # decode_attention_reference's keyword arguments
    new_slots: list[tuple[int, int]]  # (block, offset) of each row's new token


def _rope_tables(positions: list[int], d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[len(positions), D]`` as a model builds them: float32 angles ``pos * 10000^(-2i/D)``,
    duplicated over the halves, cast to the activation dtype."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _norm(kind: str, d: int, dtype: torch.dtype, g: torch.Generator) -> NormSpec:
    if kind == "gemma":  # weight stored as the offset from 1
        return NormSpec((0.3 * torch.randn(d, generator=g)).to(dtype), 1e-6, unit_offset=True)
    return NormSpec((1.0 + 0.3 * torch.randn(d, generator=g)).to(dtype), 1e-5, unit_offset=False)


def build(case: Case, dtype: torch.dtype, seed: int) -> Inputs:
    """Fresh inputs for ``case`` (module docstring): poisoned pools, packed-projection views."""
    g = torch.Generator().manual_seed(seed)
    h, hkv, d = case.shape
    b, lengths = len(case.lengths), list(case.lengths)
    qkv = (2.0 * torch.randn(b, (h + 2 * hkv) * d, generator=g)).to(dtype)  # one packed projection output
    q = qkv[:, : h * d].view(b, h, d)
    k = qkv[:, h * d : (h + hkv) * d].view(b, hkv, d)
    v = qkv[:, (h + hkv) * d :].view(b, hkv, d)
    prefix_k = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    prefix_v = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    layout = scatter_to_paged(prefix_k, prefix_v, lengths, case.bs, generator=g, spare_blocks=2, stale_entries=2)
    new_slots = []
    for row, n in enumerate(lengths):
        block = int(layout.block_tables[row, (n - 1) // case.bs])
        new_slots.append((block, (n - 1) % case.bs))
        poisoned = [n - 1] + (list(range(max(0, n - case.window))) if case.window is not None else [])
        for pos in poisoned:  # the new token's slot, and slots before the window: never read
            blk = int(layout.block_tables[row, pos // case.bs])
            layout.k_pool[blk, pos % case.bs] = float("nan")
            layout.v_pool[blk, pos % case.bs] = float("nan")
    cos = sin = None
    if case.rope == "rows":
        cos, sin = _rope_tables([n - 1 for n in lengths], d, dtype)
    elif case.rope == "shared":
        cos, sin = _rope_tables([lengths[0] - 1], d, dtype)
    q_norm = k_norm = None
    if case.norms in ("llama", "gemma"):
        q_norm, k_norm = _norm(case.norms, d, dtype, g), _norm(case.norms, d, dtype, g)
    elif case.norms == "q_only":
        q_norm = _norm("llama", d, dtype, g)
    args = {
        "q": q, "k": k, "v": v, "cos": cos, "sin": sin, "k_cache": layout.k_pool, "v_cache": layout.v_pool,
        "block_tables": layout.block_tables, "seq_lens": layout.seq_lens, "scale": d**-0.5, "window": case.window,
        "q_norm": q_norm, "k_norm": k_norm,
    }  # fmt: skip
    return Inputs(args, new_slots)


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """``|got - want| <= tol + tol * |want|`` everywhere; a NaN or inf (an unwritten element, a poisoned
    slot read) fails too."""
    kit_assert_close(got, want, what=what, atol=tol, rtol=tol)


def assert_new_keys_close(got_k: torch.Tensor, want_k: torch.Tensor, new_slots: list[tuple[int, int]], what: str) -> None:
    """The normed new keys (module docstring): each within ``2 * eps * max|k|`` of its head, and in
    bf16/fp16 at most 1% of their elements off the reference's bits. (A float32 rstd one ulp away
    moves an element across a 16-bit rounding boundary with probability ~2**-12 or less; skipping
    one of the formula's roundings moves a large share of them.)"""
    eps = torch.finfo(got_k.dtype).eps
    differ = total = 0
    for row, (block, offset) in enumerate(new_slots):
        g_, w_ = got_k[block, offset].double(), want_k[block, offset].double()  # [Hkv, D]
        err, bound = (g_ - w_).abs(), normed_key_ulps(got_k.dtype) * eps * w_.abs().amax(dim=-1, keepdim=True)
        assert (err <= bound).all(), f"{what}: row {row}'s new K is off by {err.max().item():.3g} (bound {bound.min().item():.3g})"
        differ += int((_bits(got_k[block, offset]) != _bits(want_k[block, offset])).sum())
        total += g_.numel()
    if got_k.element_size() == 2:
        assert differ <= 0.01 * total, f"{what}: {differ} of the {total} new-key elements differ bitwise (at most 1%)"


def assert_pools_match(
    got_k: torch.Tensor, got_v: torch.Tensor, want_k: torch.Tensor, want_v: torch.Tensor,
    new_slots: list[tuple[int, int]], v_new: torch.Tensor, normed: bool, what: str,
) -> None:  # fmt: skip
    """V pools bitwise; K pools bitwise except the new keys under a norm (module docstring); and the
    new values sit exactly at the rows' new slots."""
    diff_v = (_bits(got_v) != _bits(want_v)).reshape(got_v.shape[0], got_v.shape[1], -1).any(-1)
    assert not diff_v.any(), f"{what}: V pool differs from the reference at (block, offset) {diff_v.nonzero().tolist()[:6]}"
    for row, (block, offset) in enumerate(new_slots):
        assert torch.equal(_bits(got_v[block, offset]), _bits(v_new[row])), f"{what}: row {row}'s new V is not at its slot"
    got_k, want_k = got_k.clone(), want_k.clone()  # views of the inputs: compare copies
    if normed:
        assert_new_keys_close(got_k, want_k, new_slots, what)
        for block, offset in new_slots:
            got_k[block, offset] = want_k[block, offset]  # the rest bitwise below
    diff_k = (_bits(got_k) != _bits(want_k)).reshape(got_k.shape[0], got_k.shape[1], -1).any(-1)
    assert not diff_k.any(), f"{what}: K pool differs from the reference at (block, offset) {diff_k.nonzero().tolist()[:6]}"


def assert_counters_zero(what: str) -> None:
    for (device, size), counters in attention_launch._COUNTERS.items():
        assert not counters.any(), f"{what}: arrival counters for {size} (row, head block) pairs on {device} not reset: {counters.tolist()}"


def check(case: Case, dtype: torch.dtype, seed: int, hints: Any = None, edit: Any = None, **knobs: Any) -> None:
    """Kernel and reference on clones of the same poisoned inputs. ``hints``: a function of the
    inputs giving the ``(seq_lens, block_tables)`` a preloading launch reads before its wait.
    ``edit``: a function that changes the built inputs (a dict) in place before both calls."""
    inputs = build(case, dtype, seed)
    a = inputs.args
    if edit is not None:
        edit(a)
    ref = dict(a, k_cache=a["k_cache"].clone(), v_cache=a["v_cache"].clone())
    want = decode_attention_reference(**ref)
    out = torch.full(a["q"].shape, float("nan"), dtype=dtype)
    if hints is None:
        got = decode_attention_triton(
            **a, num_splits=case.splits, block_n=case.block_n, out=out, heads_per_program=case.heads, **knobs
        )
    else:
        launch_knobs = LaunchKnobs(
            case.splits, case.block_n, None, 2, preload=True, heads_per_program=case.heads, **knobs
        )
        got = attention_launch.launch(AttentionCall(**a), launch_knobs, out, hints=hints(a))
    what = f"{case} {dtype} seed {seed}"
    assert got is out
    _assert_close(got, want, TOLERANCE[dtype], what)
    assert_pools_match(a["k_cache"], a["v_cache"], ref["k_cache"], ref["v_cache"], inputs.new_slots, a["v"], a["k_norm"] is not None, what)
    assert_counters_zero(what)


G1, G2, G4 = (2, 2, 32), (4, 2, 64), (8, 2, 32)
GEMMA = (4, 1, 256)  # Gemma-3-1b's heads; lengths kept short for the interpreter
CASES = [
    # splits: one, several, more than the keys need, the host heuristic (one, off a GPU)
    Case(G2, (47, 48, 49, 1), 16, splits=1),
    Case(G2, (47, 48, 49, 1), 16, splits=3),
    Case(G2, (47, 48, 49, 1), 16, splits=64),
    Case(G2, (47, 48, 49, 1), 16, splits=None),
    # norms, both formulas; a q_norm alone; RoPE tables per row, shared, absent
    Case(G4, (15, 16, 17, 33), 16, norms="llama", splits=3),
    Case(G1, (5, 9, 1), 1, norms="gemma", rope="shared", splits=4),
    Case(G2, (31, 20), 16, norms="q_only", splits=2),
    Case(G2, (31, 20), 4, norms="llama", rope="none", splits=3),
    Case(G1, (18, 3), 16, rope="none", splits=2),
    # windows: 1, shorter and longer than the rows, across block edges; a window with many splits
    Case(G2, (30, 1, 17), 16, window=1, norms="llama", splits=2),
    Case(G2, (50, 23, 7), 12, window=7, splits=3),
    Case(G1, (45, 21, 19), 1, window=20, norms="gemma", splits=5),
    Case(G4, (64, 65, 63), 16, window=33, norms="llama", splits=8),
    # a block size that divides no length; lengths k*bs - 1, k*bs, k*bs + 1 (bs 12 and 1)
    Case(G2, (35, 36, 37, 12, 13), 12, norms="gemma", splits=3),
    Case(G4, (23, 24, 25), 1, norms="llama", splits=4),
    # single-token rows (a fresh sequence), and a Gemma-3-1b head (one KV head, D = 256, window)
    Case(G2, (1, 1), 16, norms="llama", splits=4),
    Case(GEMMA, (40, 17), 16, window=16, norms="gemma", splits=3),
    Case(GEMMA, (70,), 32, norms="gemma", rope="shared", splits=2, block_n=32),
    # a program per query head, or per part of a group (multiply-and-sum products): one and several
    # splits, windows, a Gemma-3-1b head, a group of 4 in halves
    Case(GEMMA, (40, 17), 16, window=16, norms="gemma", splits=3, heads=1),
    Case(GEMMA, (70,), 32, norms="gemma", rope="shared", splits=1, heads=1),
    Case(G4, (64, 65, 63), 16, window=33, norms="llama", splits=8, heads=2),
    Case(G2, (47, 48, 49, 1), 16, splits=3, heads=1),
    Case(G4, (23, 24, 25), 1, norms="llama", splits=4, heads=1),
    Case(GEMMA, (40, 17), 16, window=16, norms="gemma", splits=3, heads=4),  # the whole group: tensor cores
]


@interpret
@needs_interpreter
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kernel_equals_reference(case: Case, dtype: torch.dtype) -> None:
    check(case, dtype, seed=zlib.crc32(f"{case} {dtype}".encode()))


# Preloading launches: first tiles of one tile and of several (a split's fewest keys grows with them).
PRELOAD_CASES = [
    (Case(G2, (47, 48, 49, 1), 16, splits=3), 16),
    (Case(G2, (47, 48, 49, 1), 16, splits=64), 32),
    (Case(G4, (15, 16, 17, 33), 16, norms="llama", splits=3), 64),
    (Case(G2, (50, 23, 7), 12, window=7, splits=3), 16),
    (Case(G1, (45, 21, 19), 1, window=20, norms="gemma", splits=5), 32),
    (Case(G2, (35, 36, 37, 12, 13), 12, norms="gemma", splits=1), 32),
    (Case(GEMMA, (40, 17), 16, window=16, norms="gemma", splits=3), 32),
    (Case(GEMMA, (40, 17), 16, window=16, norms="gemma", splits=3, heads=1), 16),
    (Case(G4, (15, 16, 17, 33), 16, norms="llama", splits=3, heads=1), 32),
]


@interpret
@needs_interpreter
@pytest.mark.parametrize(("case", "first_n"), PRELOAD_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_preloading_launch_equals_reference(case: Case, first_n: int, dtype: torch.dtype) -> None:
    check(case, dtype, seed=zlib.crc32(f"preload {case} {first_n} {dtype}".encode()), preload=True, first_n=first_n)


def _lengths_off_by(delta: int) -> Any:
    return lambda a: ((a["seq_lens"] + delta).to(a["seq_lens"].dtype), a["block_tables"])


def _tables_shifted(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    # The right lengths, every table entry another block (some of them spare, NaN-filled ones).
    tables = a["block_tables"]
    return a["seq_lens"], (tables + 1) % a["k_cache"].shape[0]


def _garbage(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    # What an unwritten buffer may hold: lengths and block ids far out of range, both signs.
    lens = torch.tensor([10**9, -7, 3, 2**31 - 1][: a["seq_lens"].numel()], dtype=a["seq_lens"].dtype)
    tables = torch.full_like(a["block_tables"], -(2**31))
    tables[:, ::2] = 2**31 - 1
    return lens, tables


STALE_HINTS = {"lengths+1": _lengths_off_by(1), "lengths-5": _lengths_off_by(-5), "tables": _tables_shifted, "garbage": _garbage}


@interpret
@needs_interpreter
@pytest.mark.parametrize("hints", list(STALE_HINTS), ids=str)
@pytest.mark.parametrize("first_n", [16, 32])
def test_preload_through_stale_hints_reads_again(hints: str, first_n: int) -> None:
    """A preload through lengths and tables that the kernel launched just before was still writing
    (here: hints that differ from the real ones) reads the tile again after the wait: the output
    and the pools equal the reference's. Without the check it would attend other (NaN-filled)
    blocks and other positions."""
    case = Case(G2, (47, 48, 33, 5), 16, norms="llama", splits=3)
    check(case, torch.float32, seed=zlib.crc32(f"stale {hints} {first_n}".encode()), hints=STALE_HINTS[hints], first_n=first_n)


@interpret
@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_launches_in_a_row_share_the_counters(dtype: torch.dtype) -> None:
    """Several launches of one size (the layers of a step): each starts from zeroed counters, so
    each must reset them; fresh inputs each time, so a stale output would not pass."""
    case = Case(G2, (40, 9, 26), 16, norms="llama", splits=4)
    for seed in range(3):
        check(replace(case, lengths=(40 - seed, 9 + 7 * seed, 26)), dtype, seed)


def _one_length_for_every_row(a: dict[str, Any]) -> None:
    """seq_lens as a stride-0 view of its first element, over storage whose next elements hold other
    lengths: a kernel that steps through seq_lens by rows instead of by its stride reads those."""
    b = a["seq_lens"].shape[0]
    storage = torch.arange(b, dtype=a["seq_lens"].dtype) * 7 + 2  # 2, 9, 16, ...: every length but the first wrong
    storage[0] = a["seq_lens"][0]
    a["seq_lens"] = storage[:1].expand(b)


@interpret
@needs_interpreter
@pytest.mark.parametrize("preload", [False, True])
def test_one_length_broadcast_to_every_row(preload: bool) -> None:
    """Rows of one length given as ``lengths[:1].expand(B)`` (what ``pos.expand(B)`` gives, and what
    a compiled step may hand the op): every row reads that length, through the tensor's stride."""
    case = Case(G2, (33, 33, 33), 16, norms="llama", splits=3)
    knobs: dict[str, Any] = {"preload": True, "first_n": 16} if preload else {}
    check(case, torch.float32, seed=zlib.crc32(f"broadcast {preload}".encode()), edit=_one_length_for_every_row, **knobs)


@interpret
@needs_interpreter
def test_two_launches_are_bitwise_identical() -> None:
    inputs = build(Case(G4, (60, 33), 16, norms="gemma", splits=6), torch.float32, 5)
    a = inputs.args
    outs = []
    for _ in range(2):
        pools = {"k_cache": a["k_cache"].clone(), "v_cache": a["v_cache"].clone()}
        outs.append(decode_attention_triton(**dict(a, **pools), num_splits=6, block_n=16))
    assert torch.equal(_bits(outs[0]), _bits(outs[1])), "the combine is not deterministic"


@interpret
@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_writes_a_contiguous_layer_through_its_identity_view(dtype: torch.dtype) -> None:
    """A static cache layer ``[B, Hkv, S, D]`` as its overlapping strided pool view: the new K/V land
    at ``layer[b, :, n - 1]`` and nothing else in the layer changes."""
    b, hkv, s, d, h = 3, 2, 48, 32, 4
    g = torch.Generator().manual_seed(11)
    lengths = [1, 30, 48]
    layer_k = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    layer_v = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    for row, n in enumerate(lengths):  # unwritten positions of a static cache, and the new one
        layer_k[row, :, n - 1 :] = float("nan")
        layer_v[row, :, n - 1 :] = float("nan")
    q, k, v = (torch.randn(b, heads, d, generator=g).to(dtype) for heads in (h, hkv, hkv))
    cos, sin = _rope_tables([n - 1 for n in lengths], d, dtype)
    norm = _norm("llama", d, dtype, g)
    seq_lens = torch.tensor(lengths, dtype=torch.int64)
    ref_k, ref_v = layer_k.clone(), layer_v.clone()
    ref_pool_k, tables = contiguous_layer_as_paged(ref_k, 16)
    ref_pool_v, _ = contiguous_layer_as_paged(ref_v, 16)
    want = decode_attention_reference(q, k, v, cos, sin, ref_pool_k, ref_pool_v, tables, seq_lens, 0.3, None, norm, norm)
    pool_k, _ = contiguous_layer_as_paged(layer_k, 16)
    pool_v, _ = contiguous_layer_as_paged(layer_v, 16)
    got = decode_attention_triton(q, k, v, cos, sin, pool_k, pool_v, tables, seq_lens, 0.3, None, norm, norm, num_splits=2, block_n=16)
    _assert_close(got, want, TOLERANCE[dtype], "identity view")
    for row, n in enumerate(lengths):
        assert torch.equal(_bits(layer_v[row, :, n - 1]), _bits(v[row])), f"row {row}: V not at layer[{row}, :, {n - 1}]"
    new = torch.zeros(b, s, dtype=torch.bool)
    for row, n in enumerate(lengths):
        new[row, n - 1] = True
    assert torch.equal(_bits(layer_v), _bits(ref_v)), "the V layer differs from the reference's"
    same_k = _bits(layer_k) == _bits(ref_k)  # [B, Hkv, S, D]
    assert same_k.all(-1).all(1)[~new].all(), "K changed outside the new positions"
    # The normed new keys: within the documented bound (viewed as [B, S] slots of [Hkv, D]).
    assert_new_keys_close(layer_k.transpose(1, 2), ref_k.transpose(1, 2), [(row, n - 1) for row, n in enumerate(lengths)], "identity view")


@interpret
@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("window", "splits"), [(None, 1), (None, 4), (9, 3)])
def test_prep_off_is_the_paged_attention(dtype: torch.dtype, window: int | None, splits: int) -> None:
    """``paged_decode_attention_triton``: the same kernel with no norm, no RoPE and no store; the
    pools stay untouched (bitwise)."""
    h, hkv, d, bs = 4, 2, 64, 16
    lengths = [47, 48, 1, 17]
    g = torch.Generator().manual_seed(splits + (window or 0))
    k = torch.randn(len(lengths), hkv, max(lengths), d, generator=g).to(dtype)
    v = torch.randn(len(lengths), hkv, max(lengths), d, generator=g).to(dtype)
    layout = scatter_to_paged(k, v, lengths, bs, generator=g, spare_blocks=2, stale_entries=2)
    q = torch.randn(len(lengths), h, d, generator=g).to(dtype)
    before_k, before_v = layout.k_pool.clone(), layout.v_pool.clone()
    args = (q, layout.k_pool, layout.v_pool, layout.block_tables, layout.seq_lens, 0.125, window)
    got = paged_decode_attention_triton(*args, splits, block_n=16)
    _assert_close(got, paged_decode_attention_reference(*args), TOLERANCE[dtype], f"window {window} splits {splits}")
    assert torch.equal(_bits(layout.k_pool), _bits(before_k)) and torch.equal(_bits(layout.v_pool), _bits(before_v))
    assert_counters_zero("prep off")


# What a functionalized (copying) mutation leaves in Inductor's wrapper: a new buffer for the pool,
# a kernel copying into it or back out of it (named ``..._copy_...``), or a clone.
COPIES = re.compile(r"copy_|\bclone\(|empty_strided\w*\(")


def _call_body(code: list[str]) -> str:
    """The body of the generated wrapper's ``call`` (where buffers are allocated and ops run)."""
    source = "\n".join(code)
    start = source.index("def call(")
    return source[start : source.index("return (", start)]


@interpret
@needs_interpreter
def test_compiled_op_writes_the_cache_in_place() -> None:
    """``torch.compile(fullgraph=True)`` keeps ``infer_ref::decode_attention`` as one node that
    mutates the pool it is given (no functional copy of the layer), for a pool passed in and for a
    layer's strided view of a ``[L, B, Hkv, S, D]`` buffer taken inside the compiled function."""
    from torch._inductor.utils import run_and_get_code

    b, h, hkv, s, d, layers = 2, 4, 2, 64, 32, 3
    g = torch.Generator().manual_seed(3)
    k_all = torch.randn(layers, b, hkv, s, d, generator=g)
    v_all = torch.randn(layers, b, hkv, s, d, generator=g)
    q, k, v = (torch.randn(b, heads, d, generator=g) for heads in (h, hkv, hkv))
    cos, sin = _rope_tables([9, 32], d, torch.float32)
    lens = torch.tensor([10, 33], dtype=torch.int32)

    def op(q, k, v, k_pool, v_pool, tables, lens):  # type: ignore[no-untyped-def]
        return torch.ops.infer_ref.decode_attention(
            q, k, v, cos, sin, None, 1e-6, False, None, 1e-6, False, k_pool, v_pool, tables, lens, 0.2, 0
        )

    def on_a_layer(q, k, v, k_all, v_all, lens):  # type: ignore[no-untyped-def]
        k_pool, tables = contiguous_layer_as_paged(k_all[1], 16)
        v_pool, _ = contiguous_layer_as_paged(v_all[1], 16)
        return op(q, k, v, k_pool, v_pool, tables, lens)

    want_k, want_v = k_all.clone(), v_all.clone()
    ref_k, tables = contiguous_layer_as_paged(want_k[1], 16)
    ref_v, _ = contiguous_layer_as_paged(want_v[1], 16)
    want = decode_attention_reference(q, k, v, cos, sin, ref_k, ref_v, tables, lens, 0.2)

    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(on_a_layer, fullgraph=True), q, k, v, k_all, v_all, lens)
    _assert_close(got, want, 1e-5, "compiled, a layer's view")
    assert torch.equal(k_all, want_k) and torch.equal(v_all, want_v), "the compiled call did not write the cache"
    body = _call_body(code)
    assert "torch.ops.infer_ref.decode_attention.default(" in body, "the op is not one node in the compiled code"
    assert not COPIES.search(body), "the compiled code copies the cache:\n" + body

    want_k, want_v = k_all.clone(), v_all.clone()  # layer 2 next, through a pool passed in
    ref_k, tables = contiguous_layer_as_paged(want_k[2], 16)
    ref_v, _ = contiguous_layer_as_paged(want_v[2], 16)
    want = decode_attention_reference(q, k, v, cos, sin, ref_k, ref_v, tables, lens, 0.2)
    k_pool, _ = contiguous_layer_as_paged(k_all[2], 16)
    v_pool, _ = contiguous_layer_as_paged(v_all[2], 16)
    got, code = run_and_get_code(torch.compile(op, fullgraph=True), q, k, v, k_pool, v_pool, tables, lens)
    _assert_close(got, want, 1e-5, "compiled, a pool passed in")
    assert torch.equal(k_all, want_k) and torch.equal(v_all, want_v), "the compiled call did not write the pool passed in"
    assert not COPIES.search(_call_body(code)), "the compiled code copies the pool:\n" + _call_body(code)


def _top_level_args(call: str) -> list[str]:
    """The arguments of ``name(a, f(b, c), d)`` split at the commas outside any bracket."""
    inner = call[call.index("(") + 1 : call.rindex(")")]
    args, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            args.append(inner[start:i].strip())
            start = i + 1
    return [*args, inner[start:].strip()]


@interpret
@needs_interpreter
def test_compiled_layers_share_one_computation_of_the_rope_rows() -> None:
    """Under ``torch.compile`` the layers' decode-step ops read the step's cos/sin rows from one
    buffer, computed once: Inductor may hand the ops any layout (the kernel takes strides), so it
    copies nothing per layer. Under the default (exact strides) it computed the rows again into a
    buffer of each layer's own: 26 copies for Gemma, in nine small kernels a step. The outputs and
    the cache writes equal the reference's."""
    from torch._inductor.utils import run_and_get_code

    import infer_ref.fast.decode_step  # noqa: F401  # registers infer_ref::contiguous_decode_step

    b, h, hkv, s, d, layers = 2, 4, 2, 32, 16, 3
    g = torch.Generator().manual_seed(11)
    k_all = torch.randn(layers, b, hkv, s, d, generator=g)
    v_all = torch.randn(layers, b, hkv, s, d, generator=g)
    qs, ks, vs = (torch.randn(layers, b, heads, d, generator=g) for heads in (h, hkv, hkv))
    pos = torch.tensor([9])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def rope_rows(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = pos.float()[:, None] * inv_freq[None, :]  # [1, D/2]
        emb = torch.cat((angles, angles), dim=-1)  # [1, D]
        return emb.cos(), emb.sin()

    def step(qs, ks, vs, k_all, v_all, pos):  # type: ignore[no-untyped-def]
        cos, sin = rope_rows(pos)
        lengths = (pos + 1).expand(b)  # every row at the same position, as a static cache's step
        return torch.stack([
            torch.ops.infer_ref.contiguous_decode_step(
                qs[i], ks[i], vs[i], cos, sin, None, None, 1e-6, False, k_all, v_all, i, lengths, 0.25, 0
            )
            for i in range(layers)
        ])  # fmt: skip

    want_k, want_v = k_all.clone(), v_all.clone()
    cos, sin = rope_rows(pos)
    lens = (pos + 1).expand(b)
    want = []
    for i in range(layers):
        k_pool, tables = contiguous_layer_as_paged(want_k[i], 16)
        v_pool, _ = contiguous_layer_as_paged(want_v[i], 16)
        want.append(decode_attention_reference(qs[i], ks[i], vs[i], cos, sin, k_pool, v_pool, tables, lens, 0.25))

    torch._dynamo.reset()
    # Compiled afresh: the FX graph cache's key leaves out the ops' tags, so a cached graph could
    # hold another layout's code.
    with torch._inductor.config.patch(force_disable_caches=True):
        got, code = run_and_get_code(torch.compile(step, fullgraph=True), qs, ks, vs, k_all, v_all, pos)
    _assert_close(got, torch.stack(want), 1e-5, "compiled layers")
    assert torch.equal(k_all, want_k) and torch.equal(v_all, want_v), "the compiled layers did not write the cache"
    calls = re.findall(r"torch\.ops\.infer_ref\.contiguous_decode_step\.default\(.*\)", _call_body(code))
    assert len(calls) == layers, f"expected {layers} op calls in the compiled code, found {len(calls)}"
    rows = {tuple(_top_level_args(call)[3:5]) for call in calls}  # (cos, sin) as each call passes them
    assert len(rows) == 1, f"the layers read their cos/sin rows from different buffers: {sorted(rows)}"


# -- compiled ahead of time for an H100 (sm_90), no GPU needed ---------------------------------------

H100_SHARED_MEMORY = 227 * 1024  # the most dynamic shared memory one block may opt into on sm_90
FAMILY_SHAPES = {"llama": (32, 8, 64), "qwen3": (16, 8, 128), "gemma3": (4, 1, 256)}
FAMILY_NORMS = {"llama": NORM_NONE, "qwen3": NORM_LLAMA, "gemma3": NORM_GEMMA}
H100 = DeviceProfile(capability=(9, 0), sm_count=132)  # what the ahead-of-time compile targets


def compile_for_sm90(
    family: str,
    dtype: str,
    splits: int,
    prep: bool,
    *,
    block_n: int | None = None,
    fp_fusion: bool | None = None,
    preload: bool = False,
    first_n: int | None = None,
    heads_per_program: int | None = None,
    num_warps: int | None = None,
) -> Any:
    """Compile the kernel as a launch of this family's shape would (the heuristic's warps, strides
    of 1 and lengths specialised as Triton's launcher does, 16-byte aligned pointers) for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    h, hkv, d = FAMILY_SHAPES[family]
    tile = default_tile(d, H100)
    block_n = tile.block_n if block_n is None else block_n
    norm = FAMILY_NORMS[family] if prep else NORM_NONE
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    constexprs = attention_launch.kernel_constexprs(
        h, hkv, d, splits, block_n, torch_dtype, new_kv=prep, rope=prep, q_norm=norm, k_norm=norm,
        first_n=max(tile.first_n, block_n) if first_n is None else first_n, preload=preload,
        heads_per_program=tile.heads_per_program if heads_per_program is None else heads_per_program,
    )  # fmt: skip
    constexprs["USE_PDL"] = True  # as an H100 launch compiles it
    unit_strides = {"stride_qd", "stride_nkd", "stride_nvd", "stride_cd", "stride_sd", "stride_qw", "stride_kw",
                    "stride_kd", "stride_vd", "stride_tm", "stride_hm", "stride_lb", "stride_hlb", "stride_od"}  # fmt: skip
    pointer_types = {"part_out_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32",
                     "counter_ptr": "*i32", "lens_ptr": "*i32", "table_ptr": "*i32", "hint_lens_ptr": "*i32",
                     "hint_table_ptr": "*i32"}  # fmt: skip
    signature: dict[str, str] = {}
    consts: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(attention_kernel._decode_attention_kernel.arg_names):  # defined with Triton only
        if name in constexprs or name in unit_strides:
            signature[name] = "constexpr"
            consts[(i,)] = constexprs.get(name, 1)
        elif name.endswith("_ptr"):
            signature[name] = pointer_types.get(name, "*" + dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in ("scale", "q_eps", "k_eps") else "i32"
    source = ASTSource(fn=attention_kernel._decode_attention_kernel, signature=signature, constexprs=consts, attrs=attrs)
    options = {"num_warps": tile.num_warps if num_warps is None else num_warps, "num_stages": 2, **attention_launch.LAUNCH_OPTIONS}
    if fp_fusion is not None:
        options["enable_fp_fusion"] = fp_fusion
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


# (family, dtype, splits, prep stages, preload): the decode steps' launches (prep and preload on),
# the dispatching entry point's (no preload), the paged attention's (prep off, never a preload).
SM90_CASES = [
    ("llama", "bf16", 64, True, True), ("qwen3", "bf16", 64, True, True), ("gemma3", "bf16", 128, True, True),
    ("gemma3", "bf16", 32, True, True), ("llama", "bf16", 1, True, True), ("llama", "bf16", 64, True, False),
    ("qwen3", "fp16", 1, True, False), ("llama", "fp32", 8, True, False), ("llama", "bf16", 64, False, False),
    ("gemma3", "bf16", 1, False, False),
]  # fmt: skip


@interpret
@pytest.mark.skipif(not HAVE_TRITON, reason="compiles the Triton kernel: needs Triton installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter")
@pytest.mark.parametrize(("family", "dtype", "splits", "prep", "preload"), SM90_CASES)
def test_kernel_compiles_for_h100(family: str, dtype: str, splits: int, prep: bool, preload: bool) -> None:
    """Fits one H100 block's shared memory; in the PTX: the dependency
    wait comes before any global store or atomic; before it, a preloading launch issues the first
    tile's vector loads of K/V (the compiler did not sink them past the wait), and a launch without
    preload and without norm weights to prefetch loads nothing; with several splits exactly one
    arrival atomic, acq_rel at gpu scope, preceded by a barrier, and the partials read through L2
    (``ld.global.cg``); with one split no atomic at all."""
    compiled = compile_for_sm90(family, dtype, splits, prep, preload=preload)
    assert compiled.metadata.shared <= H100_SHARED_MEMORY, f"{compiled.metadata.shared} bytes of shared memory"
    ptx = compiled.asm["ptx"]
    # Eager torch rounds every 16-bit product and sum; a 16-bit multiply-add rounds them once.
    assert not re.search(r"fma\.rn\.(bf16|f16)", ptx), "a 16-bit multiply-add: a rounding of eager torch's is skipped"
    wait = ptx.index("griddepcontrol.wait")
    before = ptx[:wait]
    assert not re.search(r"st\.global|atom\.", before), "a global store or atomic before the dependency wait"
    if preload:
        # K/V elements are 16-bit (scalar loads here: the compile has no stride divisibility hints).
        assert re.search(r"ld\.global(\.\w+)*\.(v[248]|b16)", before), "a preloading launch issues no K/V load before the wait"
    elif FAMILY_NORMS[family] == NORM_NONE or not prep:
        assert "ld.global" not in before, "a global load before the dependency wait (only norm weights may come first)"
    atomics = re.findall(r"atom\.[\w.]+", ptx)
    if splits == 1:
        assert atomics == [] and "ld.global.cg" not in ptx, "one split must skip the counter and the partials"
        return
    assert atomics == ["atom.global.gpu.acq_rel.add.u32"], f"arrival atomics: {atomics}"
    arrival = ptx.index("atom.global.gpu.acq_rel")
    assert "bar.sync" in ptx[ptx.rindex("st.global", 0, arrival) : arrival], "no barrier between the partial stores and the arrival"
    assert "ld.global.cg" in ptx[arrival:], "the combine does not read the partials through L2"


# Bytes of spill stores (or loads) a family's table launch may show: none, but Gemma's program per
# query head, measured fastest with its 2 bytes stored and 4 loaded (a value, never a tile's worth).
SPILL_BYTES_ALLOWED = {"gemma3": 4}


def ptxas_report(ptx: str, tmp_path: Any) -> str:
    """``ptxas -v`` on the kernel's PTX (the assembler Triton ships): registers and spills."""
    import subprocess

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip(f"no ptxas at {ptxas}")
    target = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE)
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    arch = target.group(1) if target else "sm_90a"
    done = subprocess.run([ptxas, f"-arch={arch}", "-v", str(source), "-o", os.devnull], capture_output=True, text=True, check=True)
    return done.stderr


@interpret
@pytest.mark.skipif(not HAVE_TRITON, reason="compiles the Triton kernel: needs Triton installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter")
@pytest.mark.parametrize("family", sorted(FAMILY_SHAPES))
def test_the_tile_table_does_not_spill_registers(family: str, tmp_path: Any) -> None:
    """The decode steps' launch of each family's shape, with the tiling the head-dim table picks,
    assembles for sm_90a without spilling registers to local memory, beyond a few bytes (the table
    was chosen so: the spilling settings measured, 120 to 256 bytes, were the slower ones on the
    H100, benchmarks/log/DECODE_LOG.md). Gemma's program per query head assembles to 168 registers
    with 2 bytes spilled and reloaded twice (4 bytes of loads): a single value, not a tile; it is
    the setting measured fastest. The others spill nothing."""
    report = ptxas_report(compile_for_sm90(family, "bf16", 64, True, preload=True).asm["ptx"], tmp_path)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", report)
    allowed = SPILL_BYTES_ALLOWED.get(family, 0)
    assert spills and all(int(n) <= allowed for n in spills), f"{family}: registers spill (at most {allowed} bytes)\n{report}"


@interpret
@pytest.mark.skipif(not HAVE_TRITON, reason="compiles the Triton kernel: needs Triton installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter")
@pytest.mark.parametrize(("family", "block_n", "first_n"), [("llama", 64, 128), ("gemma3", 16, 64), ("qwen3", 32, 32)])
def test_first_tile_larger_than_the_loop_tile_compiles(family: str, block_n: int, first_n: int) -> None:
    """A first tile of more keys than the loop's tiles (the interpreter does not check the types
    of loop-carried values; the compiler does): compiles for sm_90, preloading and not."""
    for preload in (False, True):
        compiled = compile_for_sm90(family, "bf16", 16, True, block_n=block_n, first_n=first_n, preload=preload)
        assert compiled.metadata.shared <= H100_SHARED_MEMORY, f"{compiled.metadata.shared} bytes of shared memory"


@interpret
@pytest.mark.skipif(not HAVE_TRITON, reason="compiles the Triton kernel: needs Triton installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for a GPU target: not under the interpreter")
def test_float32_launches_compile_without_contraction() -> None:
    """Float32 RoPE must round ``x*cos`` and ``r*sin`` separately: the launch turns multiply-add
    contraction off, which leaves only the IEEE ``tl.dot``'s own FMAs in the PTX."""
    fused = compile_for_sm90("llama", "fp32", 8, True, fp_fusion=True).asm["ptx"]
    unfused = compile_for_sm90("llama", "fp32", 8, True).asm["ptx"]
    count = lambda ptx: len(re.findall(r"fma\.rn\.f32", ptx))  # noqa: E731
    assert count(unfused) < count(fused), "turning contraction off changed nothing: is the option still passed?"
