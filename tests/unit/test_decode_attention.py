"""The fused decode attention's definition on the CPU: reference, dispatch, argument checks.

``decode_attention_reference`` is checked bit for bit against the composition of the torch
definitions it stands for (``rms_norm``, ``apply_rope``, ``store_kvcache_reference``,
``paged_decode_attention_reference``, called here as a model's layer would), and in float64 against
attention written out (the per-head norm and the rotation by their formulas, attention by
``infer_ref.conformance.oracles.definitions``). Every bad argument is refused with an error naming it, before
anything is written. On a CPU the dispatching ``decode_attention`` must take the reference. The
Triton kernel is checked against the reference under Triton's interpreter
(``tests/kernels/test_decode_attention_interpret.py``) and on a GPU
(``tests/kernels/test_decode_attention_gpu.py``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys
from infer_ref.conformance.oracles.paged import scatter_to_paged
from infer_ref.fast.kernels.attention import (
    AttentionCall,
    LaunchKnobs,
    check_decode_attention_args,
    decode_attention,
    decode_attention_reference,
    decode_attention_triton,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from infer_ref.fast.kernels.attention import kernel as attention_kernel
from infer_ref.fast.kernels.attention import launch as attention_launch
from infer_ref.fast.kernels.attention import op as attention_op
from infer_ref.fast.kernels.store import store_kvcache_reference
from infer_ref.norm import NormSpec, rms_norm
from infer_ref.rotary import apply_rope


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _case(
    shape: tuple[int, int, int], lengths: list[int], bs: int, dtype: torch.dtype, seed: int,
    norms: str = "none", rope: str = "rows",
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:  # fmt: skip
    """Keyword arguments of ``decode_attention_reference`` (q/k/v views of one packed projection,
    prefix K/V in permuted blocks, NaN in every unowned slot and in each row's new slot), and the
    contiguous prefix K/V ``[B, Hkv, max_len, D]`` they were scattered from."""
    g = _gen(seed)
    h, hkv, d = shape
    b = len(lengths)
    qkv = torch.randn(b, (h + 2 * hkv) * d, generator=g).to(dtype)
    prefix_k = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    prefix_v = torch.randn(b, hkv, max(lengths), d, generator=g).to(dtype)
    layout = scatter_to_paged(prefix_k, prefix_v, lengths, bs, generator=g, stale_entries=2)
    for row, n in enumerate(lengths):
        block = int(layout.block_tables[row, (n - 1) // bs])
        layout.k_pool[block, (n - 1) % bs] = float("nan")
        layout.v_pool[block, (n - 1) % bs] = float("nan")
    cos = sin = None
    if rope != "none":
        angles = torch.rand(b if rope == "rows" else 1, d // 2, generator=g, dtype=torch.float64) * 40
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q_norm = k_norm = None
    if norms != "none":
        gemma = norms == "gemma"
        weights = [(0.3 * torch.randn(d, generator=g) + (0.0 if gemma else 1.0)).to(dtype) for _ in range(2)]
        q_norm, k_norm = (NormSpec(w, 1e-6, unit_offset=gemma) for w in weights)
    args = {
        "q": qkv[:, : h * d].view(b, h, d), "k": qkv[:, h * d : (h + hkv) * d].view(b, hkv, d),
        "v": qkv[:, (h + hkv) * d :].view(b, hkv, d), "cos": cos, "sin": sin,
        "k_cache": layout.k_pool, "v_cache": layout.v_pool, "block_tables": layout.block_tables,
        "seq_lens": layout.seq_lens, "scale": 0.37, "window": None, "q_norm": q_norm, "k_norm": k_norm,
    }  # fmt: skip
    return args, prefix_k, prefix_v


def _with_fresh_caches(args: dict[str, Any]) -> dict[str, Any]:
    return dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())


# -- the definition --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("norms", ["none", "llama", "gemma"])
@pytest.mark.parametrize(("rope", "window"), [("rows", None), ("shared", 5), ("none", None)])
def test_reference_is_the_composition_of_the_torch_definitions(dtype: torch.dtype, norms: str, rope: str, window: int | None) -> None:
    """Bit for bit: per-head norms, RoPE (``apply_rope`` on ``[B, H, 1, D]``, one table row per row
    or one shared), the store at ``table[b, p // bs] * bs + p % bs`` for ``p = seq_lens[b] - 1``,
    then attention over the stored prefix; output and both pools."""
    args, _, _ = _case((4, 2, 16), [9, 16, 17, 1], 4, dtype, seed=len(norms) + len(rope), norms=norms, rope=rope)
    args["window"] = window
    ours = _with_fresh_caches(args)
    got = decode_attention_reference(**ours)

    theirs = _with_fresh_caches(args)
    q, k = args["q"][:, :, None], args["k"][:, :, None]  # [B, H, 1, D]: one new token per row
    if norms != "none":
        q = rms_norm(q, args["q_norm"].weight, 1e-6, unit_offset=norms == "gemma")
        k = rms_norm(k, args["k_norm"].weight, 1e-6, unit_offset=norms == "gemma")
    if rope == "rows":  # [B, T=1, D]: each row its own position
        q, k = apply_rope(q, args["cos"][:, None], args["sin"][:, None]), apply_rope(k, args["cos"][:, None], args["sin"][:, None])
    elif rope == "shared":  # [T=1, D]: one row for all
        q, k = apply_rope(q, args["cos"], args["sin"]), apply_rope(k, args["cos"], args["sin"])
    tables, bs = args["block_tables"], 4
    slots = [int(tables[row, (n - 1) // bs]) * bs + (n - 1) % bs for row, n in enumerate(args["seq_lens"].tolist())]
    store_kvcache_reference(k[:, :, 0], args["v"], theirs["k_cache"], theirs["v_cache"], torch.tensor(slots))
    want = paged_decode_attention_reference(q[:, :, 0], theirs["k_cache"], theirs["v_cache"], tables, args["seq_lens"], 0.37, window)

    assert torch.equal(_bits(got), _bits(want)), "output differs from the composition"
    assert torch.equal(_bits(ours["k_cache"]), _bits(theirs["k_cache"])), "K pool differs from the composition"
    assert torch.equal(_bits(ours["v_cache"]), _bits(theirs["v_cache"])), "V pool differs from the composition"


def _norm64(x: torch.Tensor, spec: NormSpec | None) -> torch.Tensor:
    """RMSNorm over the last dim by its formula: ``x / sqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``)."""
    if spec is None:
        return x
    w = spec.weight.double()
    scale = (1.0 + w) if spec.unit_offset else w
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + spec.eps) * scale


def _rope64(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    """Element ``e < D/2``: ``x[e] cos[e] - x[e + D/2] sin[e]``; ``e >= D/2``: ``x[e] cos[e] + x[e - D/2] sin[e]``."""
    if cos is None or sin is None:
        return x
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for e in range(x.shape[-1]):
        partner = x[..., e + half] * -1.0 if e < half else x[..., e - half]
        out[..., e] = x[..., e] * cos[..., e] + partner * sin[..., e]
    return out


@pytest.mark.parametrize(("norms", "window", "rope"), [("none", None, "rows"), ("llama", 6, "rows"), ("gemma", None, "shared"), ("none", 1, "none")])
def test_reference_in_float64_is_attention_written_out(norms: str, window: int | None, rope: str) -> None:
    """The new key normed and rotated by the formulas, the prefix's keys as stored, attention by
    ``naive_attention`` over the keys visible from position ``n - 1``; the cache holds the new
    key and the raw value at that position. The norms' definition normalises in float32
    (``rms_norm`` takes ``x.float()``), so with a norm the agreement is float32's."""
    lengths, bs = [11, 4, 1, 8], 4
    args, prefix_k, prefix_v = _case((6, 2, 8), lengths, bs, torch.float64, seed=7, norms=norms, rope=rope)
    args["window"] = window
    got = decode_attention_reference(**args)
    tol = 1e-12 if norms == "none" else 1e-5
    b = len(lengths)
    cos, sin = args["cos"], args["sin"]
    if cos is not None and cos.shape[0] == 1:
        cos, sin = cos.expand(b, -1), sin.expand(b, -1)
    rows_cs = (cos[:, None], sin[:, None]) if cos is not None and sin is not None else (None, None)
    q = _rope64(_norm64(args["q"], args["q_norm"]), *rows_cs)  # [B, H, D]
    k_new = _rope64(_norm64(args["k"], args["k_norm"]), *rows_cs)  # [B, Hkv, D]
    for row, n in enumerate(lengths):
        keys = prefix_k[row : row + 1, :, :n].clone()  # [1, Hkv, n, D]
        values = prefix_v[row : row + 1, :, :n].clone()
        keys[0, :, n - 1], values[0, :, n - 1] = k_new[row], args["v"][row]
        want = naive_attention(q[row][None, :, None], keys, values, visible_keys(1, n - 1, window), 0.37)[0, :, 0]
        torch.testing.assert_close(got[row], want, rtol=tol, atol=tol, msg=lambda m, row=row: f"row {row}: {m}")
        block = int(args["block_tables"][row, (n - 1) // bs])
        stored_k, stored_v = args["k_cache"][block, (n - 1) % bs], args["v_cache"][block, (n - 1) % bs]
        torch.testing.assert_close(stored_k, k_new[row], rtol=tol, atol=tol, msg=lambda m, row=row: f"row {row}'s stored key: {m}")
        assert torch.equal(stored_v, args["v"][row]), f"row {row}'s stored value is not the raw v"


# -- dispatch --------------------------------------------------------------------------------------


def test_cpu_calls_take_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("the kernel path was taken on a CPU")

    monkeypatch.setattr(attention_op, "decode_attention_triton", boom)
    monkeypatch.setattr(attention_launch, "launch", boom)
    args, _, _ = _case((4, 2, 16), [5, 13], 4, torch.bfloat16, seed=3, norms="llama")
    ours, ref = _with_fresh_caches(args), _with_fresh_caches(args)
    got = decode_attention(**ours)
    want = decode_attention_reference(**ref)
    assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(_bits(ours["k_cache"]), _bits(ref["k_cache"])) and torch.equal(_bits(ours["v_cache"]), _bits(ref["v_cache"]))


def test_the_op_declares_that_it_writes_the_caches() -> None:
    """``infer_ref::decode_attention`` mutates k_cache and v_cache (``Tensor(a!)``) and nothing else,
    so torch.compile orders it and keeps the write in place."""
    schema = torch.ops.infer_ref.decode_attention.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"k_cache", "v_cache"}, str(schema)


def test_paged_attention_is_the_same_kernel_with_the_prep_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """One decode attention kernel in the codebase: the paged entry point launches the fused kernel
    with no new K/V, no RoPE and no norms; the separate split and combine kernels are gone."""
    assert not hasattr(attention_kernel, "_decode_split_kernel") and not hasattr(attention_kernel, "_decode_combine_kernel")
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(attention_launch, "launch", lambda *a: calls.append(a) or a[0].q)
    args, _, _ = _case((4, 2, 16), [5, 13], 4, torch.float32, seed=4)
    paged_decode_attention_triton(
        args["q"], args["k_cache"], args["v_cache"], args["block_tables"], args["seq_lens"], 0.5, 3, 2, block_n=32
    )
    ((call, knobs),) = calls
    assert isinstance(call, AttentionCall) and isinstance(knobs, LaunchKnobs)
    assert (call.k, call.v, call.cos, call.sin) == (None, None, None, None), "k, v, cos, sin must be None (no new token, no RoPE)"
    assert (call.q_norm, call.k_norm) == (None, None), "no norms"
    assert call.window == 3 and (knobs.num_splits, knobs.block_n, knobs.num_warps) == (2, 32, None)


# -- bad arguments ---------------------------------------------------------------------------------


def _good() -> dict[str, Any]:
    """B=2, H=4, Hkv=2, D=8, pools of 5 blocks of 4 slots (12 positions per row through 3-entry tables)."""
    g = _gen(0)
    return {
        "q": torch.randn(2, 4, 8, generator=g), "k": torch.randn(2, 2, 8, generator=g), "v": torch.randn(2, 2, 8, generator=g),
        "cos": torch.randn(2, 8, generator=g), "sin": torch.randn(2, 8, generator=g),
        "k_cache": torch.full((5, 4, 2, 8), float("nan")), "v_cache": torch.full((5, 4, 2, 8), float("nan")),
        "block_tables": torch.tensor([[0, 1, 2], [3, 4, 0]], dtype=torch.int32), "seq_lens": torch.tensor([3, 9], dtype=torch.int32),
        "scale": 0.5, "window": None,
        "q_norm": NormSpec(torch.ones(8), 1e-6), "k_norm": NormSpec(torch.zeros(8), 1e-6, unit_offset=True),
    }  # fmt: skip


def _bad_cases() -> list[Any]:
    def bad(over: dict[str, Any], error: type[Exception], message: str, id: str) -> Any:
        return pytest.param(over, error, message, id=id)

    shared = torch.full((5, 4, 2, 8), float("nan"))
    return [
        bad({"q": [[1.0]]}, TypeError, "q must be a tensor, got list", "q not a tensor"),
        bad({"k_cache": None}, TypeError, "k_cache must be a tensor, got NoneType", "cache not a tensor"),
        bad({"q": torch.ones(2, 32)}, ValueError, "q must be [batch, num_heads, head_dim], got (2, 32)", "q rank"),
        bad({"q": torch.ones(2, 4, 8, dtype=torch.int32)}, TypeError, "q must be floating-point", "q integer"),
        bad({"q": torch.ones(2, 3, 8)}, ValueError, "num_heads (3) must be a positive multiple of the cache's num_kv_heads (2)", "H not a multiple of Hkv"),
        bad({"q": torch.ones(2, 4, 6)}, ValueError, "q has head_dim 6 but the cache holds head_dim 8", "q head_dim"),
        bad({"k": torch.ones(2, 1, 8), "v": torch.ones(2, 1, 8)}, ValueError, "k and v must be [batch=2, num_kv_heads=2, head_dim=8]", "k heads"),
        bad({"k": torch.ones(2, 2, 6), "v": torch.ones(2, 2, 6)}, ValueError, "k and v must be [batch=2, num_kv_heads=2, head_dim=8]", "k head_dim"),
        bad({"k": torch.ones(3, 2, 8), "v": torch.ones(3, 2, 8)}, ValueError, "k and v must be [batch=2", "k batch"),
        bad({"v": torch.ones(2, 2, 4)}, ValueError, "k and v must both be [batch, num_kv_heads, head_dim], got (2, 2, 8) and (2, 2, 4)", "v shape"),
        bad({"k": torch.ones(2, 2, 8, dtype=torch.float64)}, TypeError, "k has dtype torch.float64, q has torch.float32", "k dtype"),
        bad({"v": torch.ones(2, 2, 8, dtype=torch.float16)}, TypeError, "v has dtype torch.float16", "v dtype"),
        bad({"k": torch.ones(2, 2, 8, device="meta")}, ValueError, "k is on meta, q is on cpu", "k device"),
        bad({"k_cache": torch.ones(5, 4, 2, 8, dtype=torch.float64), "v_cache": torch.ones(5, 4, 2, 8, dtype=torch.float64)},
            TypeError, "k_cache has dtype torch.float64, q has torch.float32", "cache dtype"),
        bad({"v_cache": torch.ones(5, 4, 1, 8)}, ValueError, "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim]", "cache shapes"),
        bad({"k_cache": shared, "v_cache": shared}, ValueError, "k_cache and v_cache share memory", "one pool twice"),
        bad({"cos": torch.ones(3, 8), "sin": torch.ones(3, 8)}, ValueError, "cos must be [batch=2, head_dim=8] or [1, head_dim=8]", "cos rows"),
        bad({"cos": torch.ones(2, 6), "sin": torch.ones(2, 6)}, ValueError, "cos must be [batch=2, head_dim=8] or [1, head_dim=8]", "cos head_dim"),
        bad({"cos": torch.ones(8), "sin": torch.ones(8)}, ValueError, "cos must be [batch=2, head_dim=8] or [1, head_dim=8] (one row for every row), got (8,)", "cos 1-D"),
        bad({"sin": torch.ones(1, 8)}, ValueError, "cos and sin must have one shape, got (2, 8) and (1, 8)", "sin shape"),
        bad({"sin": None}, ValueError, "cos and sin must both be given (RoPE) or both be None", "sin missing"),
        bad({"cos": torch.ones(2, 8, dtype=torch.float16)}, TypeError, "cos has dtype torch.float16, q has torch.float32", "cos dtype"),
        bad({"sin": torch.ones(2, 8, device="meta")}, ValueError, "sin is on meta, q is on cpu", "sin device"),
        bad({"q": torch.ones(2, 4, 7), "k": torch.ones(2, 2, 7), "v": torch.ones(2, 2, 7), "cos": torch.ones(1, 7), "sin": torch.ones(1, 7),
             "k_cache": torch.ones(5, 4, 2, 7), "v_cache": torch.ones(5, 4, 2, 7), "q_norm": None, "k_norm": None},
            ValueError, "RoPE needs an even head_dim", "odd head_dim"),
        bad({"q_norm": NormSpec(torch.ones(6), 1e-6)}, ValueError, "q_norm.weight must be [head_dim=8] (a per-head norm), got (6,)", "q_norm shape"),
        bad({"k_norm": NormSpec(torch.ones(8, dtype=torch.float16), 1e-6)}, TypeError, "k_norm.weight has dtype torch.float16, q has torch.float32", "k_norm dtype"),
        bad({"k_norm": NormSpec(torch.ones(8, device="meta"), 1e-6)}, ValueError, "k_norm.weight is on meta", "k_norm device"),
        bad({"q_norm": torch.ones(8)}, TypeError, "q_norm must be an infer_ref.norm.NormSpec or None, got Tensor", "q_norm type"),
        bad({"scale": 0.0}, ValueError, "scale must be a positive number, got 0.0", "scale 0"),
        bad({"scale": -1.0}, ValueError, "scale must be a positive number", "scale negative"),
        bad({"scale": True}, ValueError, "scale must be a positive number, got True", "scale bool"),
        bad({"window": 0}, ValueError, "window must be a positive int or None, got 0", "window 0"),
        bad({"window": 2.5}, ValueError, "window must be a positive int or None, got 2.5", "window float"),
        bad({"window": True}, ValueError, "window must be a positive int or None, got True", "window bool"),
        bad({"block_tables": torch.zeros(3, 3, dtype=torch.int32)}, ValueError, "block_tables must be [batch=2, max_blocks], got (3, 3)", "tables batch"),
        bad({"block_tables": torch.zeros(2, 3)}, TypeError, "block_tables must be int32 or int64", "tables dtype"),
        bad({"seq_lens": torch.ones(3, dtype=torch.int32)}, ValueError, "seq_lens must be [batch=2], got (3,)", "lens shape"),
        bad({"seq_lens": torch.ones(2)}, TypeError, "seq_lens must be int32 or int64", "lens dtype"),
        bad({"seq_lens": torch.ones(2, dtype=torch.int32, device="meta")}, ValueError, "seq_lens is on meta, q is on cpu", "lens device"),
        # values (the reference reads them; the kernel cannot without a sync)
        bad({"seq_lens": torch.tensor([0, 9], dtype=torch.int32)}, ValueError, "seq_lens holds [0]: each must be in [1, 12]", "length 0"),
        bad({"seq_lens": torch.tensor([3, 13], dtype=torch.int32)}, ValueError, "seq_lens holds [13]: each must be in [1, 12]", "length past the table"),
        bad({"block_tables": torch.tensor([[0, 1, 2], [3, 5, 0]], dtype=torch.int32)}, IndexError,
            "block_tables[1] holds [5] among its first 3 entries: block ids must be in [0, 5)", "block id past the pool"),
        bad({"block_tables": torch.tensor([[0, 1, 2], [0, 4, 1]], dtype=torch.int32), "seq_lens": torch.tensor([3, 3], dtype=torch.int32)},
            ValueError, "writes one slot twice", "two rows, one slot"),
    ]  # fmt: skip


@pytest.mark.parametrize(("over", "error", "message"), _bad_cases())
def test_bad_arguments_are_named_and_change_nothing(over: dict[str, Any], error: type[Exception], message: str) -> None:
    args = {**_good(), **over}
    caches = [t for t in (args["k_cache"], args["v_cache"]) if isinstance(t, torch.Tensor) and t.device.type != "meta"]
    before = [t.clone() for t in caches]
    with pytest.raises(error, match=re.escape(message)):
        decode_attention(**args)
    for t, b in zip(caches, before, strict=True):
        assert torch.equal(_bits(t), _bits(b)), "a refused call wrote into a cache"


def test_good_arguments_pass_and_the_checks_never_sync() -> None:
    """The baseline of the table above is accepted, and the host checks read metadata only: they
    pass on meta tensors, which hold no values at all."""
    decode_attention(**_good())
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in _good().items()}
    meta["q_norm"] = meta["k_norm"] = None
    check_decode_attention_args(**meta)


@pytest.mark.parametrize(
    ("knobs", "error", "message"),
    [
        ({"num_splits": 0}, ValueError, "num_splits must be a positive int or None, got 0"),
        ({"num_splits": True}, ValueError, "num_splits must be a positive int or None, got True"),
        ({"block_n": 24}, ValueError, "block_n must be a power of two >= 16"),
        ({"block_n": 8}, ValueError, "block_n must be a power of two >= 16"),
        ({"num_warps": 3}, ValueError, "num_warps must be one of (1, 2, 4, 8, 16) or None, got 3"),
        ({"num_stages": 0}, ValueError, "num_stages must be a positive int, got 0"),
        ({"first_n": 24}, ValueError, "first_n must be a power of two >= 16 (a tl.dot tile) or None, got 24"),
        ({"first_n": 8}, ValueError, "first_n must be a power of two >= 16"),
        ({"first_n": 16, "block_n": 32}, ValueError, "first_n (16) must be at least block_n (32): chunks are whole tiles"),
        ({"preload": 1}, TypeError, "preload must be a bool, got int"),
        ({"heads_per_program": 3}, ValueError, "heads_per_program must be None or a positive int dividing the group of query heads per KV head (2), got 3"),
        ({"heads_per_program": 0}, ValueError, "heads_per_program must be None or a positive int dividing"),
        ({"heads_per_program": 1.0}, ValueError, "heads_per_program must be None or a positive int dividing"),
        ({"heads_per_program": True}, ValueError, "heads_per_program must be None or a positive int dividing"),
        ({"out": torch.empty(2, 4, 7)}, ValueError, "out must be a [B, H, D] = (2, 4, 8) tensor of torch.float32"),
        ({"out": torch.empty(2, 4, 8, dtype=torch.float16)}, ValueError, "out must be a [B, H, D]"),
    ],
)
def test_kernel_knobs_are_checked_before_any_launch(knobs: dict[str, Any], error: type[Exception], message: str) -> None:
    args = _good()
    before = args["k_cache"].clone()
    with pytest.raises(error, match=re.escape(message)):
        decode_attention_triton(**args, **knobs)
    assert torch.equal(_bits(args["k_cache"]), _bits(before))


def test_a_preload_without_the_new_token_is_refused() -> None:
    """Without the new k/v the kernel reads slot ``n - 1`` from the cache, which the store launched
    just before writes: reading it before the dependency wait would race that store."""
    args = _good()
    before = args["k_cache"].clone()
    with pytest.raises(ValueError, match=re.escape("preload needs the new token's k and v")):
        call = AttentionCall.paged(args["q"], args["k_cache"], args["v_cache"], args["block_tables"], args["seq_lens"], 0.5, None)
        attention_launch.launch(call, LaunchKnobs(preload=True))
    assert torch.equal(_bits(args["k_cache"]), _bits(before))


def test_hints_of_another_shape_are_refused() -> None:
    args = _good()
    before = args["k_cache"].clone()
    hints = (args["seq_lens"][:1], args["block_tables"])
    with pytest.raises(ValueError, match=re.escape("hints must be shaped like (seq_lens, block_tables)")):
        attention_launch.launch(AttentionCall(**args), LaunchKnobs(preload=True), hints=hints)
    assert torch.equal(_bits(args["k_cache"]), _bits(before))


def test_the_kernel_refuses_float64() -> None:
    args = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in _good().items()}
    args["q_norm"] = args["k_norm"] = None
    with pytest.raises(TypeError, match=re.escape("the kernel takes bfloat16, float16 or float32, got torch.float64")):
        decode_attention_triton(**args)
    decode_attention(**args)  # the dispatching call takes the reference instead
