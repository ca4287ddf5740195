"""Launching the decode attention kernel for a checked :class:`AttentionCall`: the launch knobs
(:class:`LaunchKnobs`), the arrival counters, the compile-time arguments, and the kernel's two
entry points (:func:`decode_attention_triton`, the fused step; :func:`paged_decode_attention_triton`,
the prep stages off).

Host checks only: no sync, allocations sized by shapes alone, so a launch can be captured once a
first call of its shape has allocated the arrival counters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.attention.checks import AttentionCall
from infer_ref.fast.kernels.attention.kernel import NORM_GEMMA, NORM_LLAMA, NORM_NONE
from infer_ref.fast.kernels.attention.tuning import combine_chunk, decode_num_splits, default_tile
from infer_ref.fast.kernels.common import HAVE_TRITON, KERNEL_DTYPES, device_profile, pdl_options
from infer_ref.norm import NormSpec

if HAVE_TRITON:
    import triton

    from infer_ref.fast.kernels.attention.kernel import _decode_attention_kernel


@dataclasses.dataclass(frozen=True)
class LaunchKnobs:
    """How to launch, each None taken from the tiling of the head dim (:func:`default_tile`) or
    the split heuristic (:func:`decode_num_splits`): ``num_splits``; ``block_n`` keys per tile;
    ``first_n`` keys of each split's first tile (at least ``block_n``); ``num_warps``,
    ``num_stages``; ``heads_per_program`` (a divisor of the group); ``preload``
    (:func:`decode_attention_triton`)."""

    num_splits: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int = 2
    first_n: int | None = None
    heads_per_program: int | None = None
    preload: bool = False

    def check(self, group: int | None) -> None:
        """Each knob's type and range (``group``: query heads per KV head, None when the shapes are
        wrong, which the argument checks report)."""
        num_splits, block_n, first_n, num_warps, num_stages = (
            self.num_splits, self.block_n, self.first_n, self.num_warps, self.num_stages
        )
        if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
            raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
        if block_n is not None and not _is_tile_size(block_n):
            raise ValueError(f"block_n must be a power of two >= 16 (a tl.dot tile) or None, got {block_n!r}")
        if first_n is not None and not _is_tile_size(first_n):
            raise ValueError(f"first_n must be a power of two >= 16 (a tl.dot tile) or None, got {first_n!r}")
        if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of (1, 2, 4, 8, 16) or None, got {num_warps!r}")
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
        h = self.heads_per_program
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 1 or (group is not None and group % h)):
            raise ValueError(
                f"heads_per_program must be None or a positive int dividing the group of query heads per KV head "
                f"({group}), got {h!r}"
            )
        if not isinstance(self.preload, bool):
            raise TypeError(f"preload must be a bool, got {type(self.preload).__name__}")


def _is_tile_size(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 16 and not value & (value - 1)


def _norm_code(spec: NormSpec | None) -> int:
    if spec is None:
        return NORM_NONE
    return NORM_GEMMA if spec.unit_offset else NORM_LLAMA


# Arrival counters, one per (row, head block), zero between launches: allocated once per (device,
# size) and kept, so a captured graph holds their address (module docstring).
_COUNTERS: dict[tuple[torch.device, int], Tensor] = {}


def _counters(device: torch.device, size: int) -> Tensor:
    key = (device, size)
    if key not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"decode attention for batch x num_kv_heads = {size} on {device} was first called inside a CUDA graph "
                "capture: call it once before capturing (that call allocates the kernel's arrival counters)"
            )
        _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _COUNTERS[key]


# Compile options of every launch. No multiply-add contraction, in any dtype: the roundings eager
# torch does are the arithmetic here, and LLVM narrows a float32 product rounded to bf16/fp16 into a
# 16-bit multiply, which it then fuses with the next add (RoPE's x*cos + r*sin rounded once, not
# three times: on an H100, 10% of normed-and-rotated keys one ulp off). The dots (tensor cores) are
# unaffected; float32 multiply-adds elsewhere cost one more instruction.
LAUNCH_OPTIONS: dict[str, Any] = {"enable_fp_fusion": False}


def kernel_constexprs(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_splits: int,
    block_n: int,
    dtype: torch.dtype,
    *,
    new_kv: bool,
    rope: bool,
    q_norm: int,
    k_norm: int,
    first_n: int | None = None,
    preload: bool = False,
    heads_per_program: int | None = None,
) -> dict[str, Any]:
    """The kernel's compile-time arguments for a launch of this shape (the launcher's, and what a
    test compiling the kernel ahead of time for a GPU passes); ``q_norm``/``k_norm`` are NORM_* codes,
    ``first_n`` the first tile's keys (None: ``block_n``), ``heads_per_program`` as
    :class:`LaunchKnobs` takes it."""
    group = num_heads // num_kv_heads
    heads = group if heads_per_program is None else heads_per_program
    dim_pad = triton.next_power_of_2(max(head_dim, 16))
    dot = heads == group  # a whole group on tensor cores; a part of one as multiply-and-sums
    return {
        "NUM_KV_HEADS": num_kv_heads, "GROUP": group, "HEADS": heads, "HEAD_DIM": head_dim, "NUM_SPLITS": num_splits,
        # tl.dot's smallest tile is 16 rows; the multiply-and-sum form pads to a power of two only.
        "HEADS_PAD": max(16, triton.next_power_of_2(heads)) if dot else triton.next_power_of_2(heads), "DOT": dot,
        "DIM_PAD": dim_pad, "SPLITS_PAD": triton.next_power_of_2(num_splits), "BLOCK_N": block_n,
        "FIRST_N": block_n if first_n is None else first_n, "PRELOAD": preload,
        "HEADS_C": triton.next_power_of_2(heads), "COMBINE_CHUNK": combine_chunk(heads, dim_pad, num_splits),
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "NEW_KV": new_kv, "ROPE": rope, "Q_NORM": q_norm, "K_NORM": k_norm,
    }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A launch's shape decisions, from the knobs, the tiling and the device."""

    heads: int  # query heads per program
    head_blocks: int  # programs per row (of the split grid's first axis)
    block_n: int
    first_n: int
    num_warps: int
    num_splits: int


def _plan(call: AttentionCall, knobs: LaunchKnobs) -> _Plan:
    b, h, d = call.q.shape
    _, block_size, hkv, _ = call.k_cache.shape
    group = h // hkv
    tile = default_tile(d, device_profile(call.q.device))
    # The heads a program takes: the knob (checked), else the tiling's choice (1), else the group.
    heads = (tile.heads_per_program or group) if knobs.heads_per_program is None else knobs.heads_per_program
    head_blocks = hkv * group // heads
    block_n = tile.block_n if knobs.block_n is None else knobs.block_n
    first_n = max(tile.first_n, block_n) if knobs.first_n is None else knobs.first_n
    if first_n < block_n:
        raise ValueError(f"first_n ({first_n}) must be at least block_n ({block_n}): chunks are whole tiles")
    num_splits = knobs.num_splits
    if num_splits is None:
        capacity = call.block_tables.shape[1] * block_size
        max_visible = capacity if call.window is None else min(capacity, call.window)
        # Off a GPU (the interpreter) there are no SMs to fill: one wave's worth.
        sms = device_profile(call.q.device).sm_count if call.q.device.type == "cuda" else 1
        num_splits = decode_num_splits(b, head_blocks, max_visible, first_n, sms)
    num_warps = tile.num_warps if knobs.num_warps is None else knobs.num_warps
    return _Plan(heads, head_blocks, block_n, first_n, num_warps, num_splits)


def _checked_out(q: Tensor, out: Tensor | None) -> Tensor:
    if out is None:
        return q.new_empty(q.shape)  # contiguous, whatever q's strides
    if not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        what = (tuple(out.shape), out.dtype, out.device) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"out must be a [B, H, D] = {tuple(q.shape)} tensor of {q.dtype} on {q.device}, got {what}")
    return out


def _checked_hints(call: AttentionCall, hints: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    hint_lens, hint_tables = (call.seq_lens, call.block_tables) if hints is None else hints
    if hint_tables.shape != call.block_tables.shape or hint_lens.shape != call.seq_lens.shape:
        raise ValueError(
            f"hints must be shaped like (seq_lens, block_tables) {tuple(call.seq_lens.shape)}, "
            f"{tuple(call.block_tables.shape)}, got {tuple(hint_lens.shape)}, {tuple(hint_tables.shape)}"
        )
    return hint_lens, hint_tables


def _kernel_args(call: AttentionCall, out: Tensor, plan: _Plan, hint_lens: Tensor, hint_tables: Tensor) -> list[Any]:
    """The kernel's runtime arguments, in its order (placeholders where a stage is off: never dereferenced)."""
    q, k, v, cos, sin, q_norm, k_norm = call.q, call.k, call.v, call.cos, call.sin, call.q_norm, call.k_norm
    k_cache, v_cache, block_tables, seq_lens = call.k_cache, call.v_cache, call.block_tables, call.seq_lens
    b, _, d = q.shape
    if plan.num_splits > 1:
        rows = b * plan.head_blocks
        part_out = torch.empty((rows, plan.num_splits, plan.heads, d), device=q.device, dtype=torch.float32)
        part_max = torch.empty((rows, plan.num_splits, plan.heads), device=q.device, dtype=torch.float32)
        part_sum = torch.empty_like(part_max)
        counters = _counters(q.device, rows)
    else:  # one split: no partials, no counter (the pointers are never dereferenced)
        part_out = part_max = part_sum = out
        counters = seq_lens
    nk = k if k is not None else q
    nv = v if v is not None else q
    rope = cos is not None and sin is not None
    c = cos if cos is not None else q
    s = sin if sin is not None else q
    qw = q_norm.weight if q_norm is not None else q
    kw = k_norm.weight if k_norm is not None else q
    args: list[Any] = [q, nk, nv, c, s, qw, kw, k_cache, v_cache, block_tables, seq_lens, hint_tables, hint_lens]
    args += [out, part_out, part_max, part_sum, counters]
    args += [*q.stride(), *nk.stride()[:3], *nv.stride()[:3]]
    args += [(c.stride(0) if c.shape[0] > 1 else 0) if rope else 0, c.stride(-1) if rope else 0]
    args += [(s.stride(0) if s.shape[0] > 1 else 0) if rope else 0, s.stride(-1) if rope else 0]
    args += [qw.stride(0) if q_norm is not None else 0, kw.stride(0) if k_norm is not None else 0]
    args += [*k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *hint_tables.stride()]
    args += [seq_lens.stride(0), hint_lens.stride(0), *out.stride()]
    args += [float(call.scale), k_cache.shape[1], 0 if call.window is None else call.window]
    args += [float(q_norm.eps) if q_norm is not None else 1.0, float(k_norm.eps) if k_norm is not None else 1.0]
    args += [k_cache.shape[0], block_tables.shape[1] * k_cache.shape[1]]
    return args


def launch(
    call: AttentionCall,
    knobs: LaunchKnobs = LaunchKnobs(),  # frozen: one shared default is safe
    out: Tensor | None = None,
    *,
    hints: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Launch the kernel for a checked ``call``. ``out``: a ``[B, H, D]`` buffer in q's dtype to
    write into (None: a new contiguous one). ``hints``: ``(seq_lens, block_tables)`` the preload
    reads before its dependency wait instead of the real ones (tests use it to exercise stale
    hints; None: the real ones, which is what a launch does)."""
    q = call.q
    group = q.shape[1] // call.k_cache.shape[2] if q.dim() == 3 and call.k_cache.dim() == 4 else None
    knobs.check(group)
    new_kv = call.k is not None and call.v is not None
    if knobs.preload and not new_kv:
        raise ValueError(
            "preload needs the new token's k and v: without them the kernel reads the slot n - 1 from the cache, "
            "which the kernel launched just before (the store) writes"
        )
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"the kernel takes bfloat16, float16 or float32, got {q.dtype} (the reference takes any float)")
    out = _checked_out(q, out)
    plan = _plan(call, knobs)
    hint_lens, hint_tables = _checked_hints(call, hints)
    b, h, d = q.shape
    if b == 0:
        return out
    constexprs = kernel_constexprs(
        h, call.k_cache.shape[2], d, plan.num_splits, plan.block_n, q.dtype, new_kv=new_kv,
        rope=call.cos is not None and call.sin is not None, q_norm=_norm_code(call.q_norm),
        k_norm=_norm_code(call.k_norm if new_kv else None), first_n=plan.first_n, preload=knobs.preload,
        heads_per_program=plan.heads,
    )  # fmt: skip
    _decode_attention_kernel[(b * plan.head_blocks, plan.num_splits)](
        *_kernel_args(call, out, plan, hint_lens, hint_tables),
        **constexprs,
        num_warps=plan.num_warps, num_stages=knobs.num_stages,
        **LAUNCH_OPTIONS,
        **pdl_options(q.device),
    )  # fmt: skip
    return out


@takes_arguments_of(AttentionCall)
def decode_attention_triton(
    call: AttentionCall,
    num_splits: int | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
    out: Tensor | None = None,
    first_n: int | None = None,
    preload: bool = False,
    heads_per_program: int | None = None,
) -> Tensor:
    """The fused kernel (CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``): the contract of
    :func:`decode_attention_reference`, ``[B, H, D]``. ``num_splits`` overrides the split heuristic
    (tests use it); ``block_n`` (keys per tile), ``first_n`` (keys of each split's first tile, at
    least ``block_n``), ``num_warps`` and ``num_stages`` are launch knobs (None: :func:`default_tile`
    of the head dim); ``out`` (``[B, H, D]``, q's dtype, any strides) receives the result when
    given (tests pass NaN-filled buffers, so an element the kernel never writes shows).
    ``heads_per_program``: query heads per program, a divisor of the group (query heads per KV
    head); None: the tiling's choice (:func:`default_tile`). A program taking the whole group runs
    its two products on tensor cores (the query block padded to 16 heads); one taking a part of it
    (more programs, each reading its KV head's keys) runs them as float32 multiply-and-sums, with
    no padding.

    ``preload``: read each split's first tile of cached K/V before the dependency wait (module
    docstring), so it overlaps the previous kernel's tail. A promise of the caller's: the kernel
    launched just before this one does not write this layer's cached K/V (positions before
    ``seq_lens - 1``). The lengths and table may be written by it: they are read again after the
    wait, and a tile read through stale ones is read again.

    Host checks only: no sync, allocations sized by shapes alone, so the call can be captured once
    a first call has allocated the arrival counters. ``seq_lens`` must be in ``[1, M * block_size]``,
    the table entries valid block ids and the rows' new slots distinct; the kernel cannot check
    values without a sync (the reference does).
    """
    call.check()
    knobs = LaunchKnobs(num_splits, block_n, num_warps, num_stages, first_n, heads_per_program, preload)
    return launch(call, knobs, out)


@takes_arguments_of(AttentionCall.paged)
def paged_decode_attention_triton(
    call: AttentionCall, num_splits: int | None = None, *, block_n: int | None = None, num_warps: int | None = None,
    num_stages: int = 2,
) -> Tensor:  # fmt: skip
    """The Triton kernel (CUDA tensors): the fused decode attention kernel with its prep stages off.
    ``num_splits`` overrides the split heuristic (tests use it); ``block_n`` (keys per tile),
    ``num_warps`` and ``num_stages`` are launch knobs for tuning.

    Host checks only: no sync, allocations sized by shapes alone, so the call can be captured once
    a first call of the shape has allocated the arrival counters.
    ``seq_lens`` must be in ``[1, M * block_size]`` and table entries valid block ids; the kernel
    cannot check values without a sync (the reference does).
    """
    call.check_paged()
    return launch(call, LaunchKnobs(num_splits, block_n, num_warps, num_stages))


__all__ = [
    "LAUNCH_OPTIONS",
    "AttentionCall",
    "LaunchKnobs",
    "decode_attention_triton",
    "kernel_constexprs",
    "launch",
    "paged_decode_attention_triton",
]
