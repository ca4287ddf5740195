"""The decode attention call: its arguments, declared once (:class:`AttentionCall`, which every
entry point of the family takes: ``reference.py``, ``op.py``, ``launch.py``), and its host checks:
shapes, dtypes, devices, scalars and aliasing, from metadata alone (no device synchronisation),
each error naming the argument, what it was and what was expected. The references check values too
(``reference.py``); the kernels cannot without a sync.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch
from torch import Tensor

from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.common import overlap
from infer_ref.norm import NormSpec


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One call's problem: the arguments of :func:`decode_attention_reference` and every entry
    point of the family (:func:`~infer_ref.fast.kernels.attention.reference.decode_attention_reference`
    documents each). ``k``/``v`` None: no new token (the paged attention of a prefix already
    stored, q already rotated, :meth:`paged`), and then no norms or RoPE either: the kernel's prep
    stages are off by constexprs."""

    q: Tensor  # [B, H, D]
    k: Tensor | None  # [B, Hkv, D], the new token's key before k_norm and RoPE
    v: Tensor | None  # [B, Hkv, D], stored as is
    cos: Tensor | None  # [B or 1, D]: the new token's RoPE rows; both None: no RoPE
    sin: Tensor | None
    k_cache: Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: Tensor
    block_tables: Tensor  # [B, M]
    seq_lens: Tensor  # [B]
    scale: float
    window: int | None = None
    q_norm: NormSpec | None = None
    k_norm: NormSpec | None = None

    @classmethod
    def paged(
        cls, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float,
        window: int | None = None,
    ) -> AttentionCall:  # fmt: skip
        """Attention over a stored prefix (the arguments of the paged entry points): no new token,
        no prep stages."""
        return cls(q, None, None, None, None, k_cache, v_cache, block_tables, seq_lens, scale, window)

    def arguments(self) -> dict[str, Any]:
        """The arguments by name, as the entry points take them (the tensors themselves, not copies)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def check_paged(self) -> None:
        """Shapes, dtypes, devices and scalars of the paged read (host metadata only)."""
        _check_paged(self)

    def check(self) -> None:
        """Shapes, dtypes, devices, scalars and aliasing of a decode step (host metadata only: no
        device synchronisation). Each error names the argument, what it was and what was expected;
        nothing is written before the checks pass."""
        _check_step(self)


def _check_paged(call: AttentionCall) -> None:
    q, k_cache, v_cache, block_tables, seq_lens = call.q, call.k_cache, call.v_cache, call.block_tables, call.seq_lens
    scale, window = call.scale, call.window
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q has head_dim {d} but the cache holds head_dim {k_cache.shape[3]}")
    if hkv == 0 or h % hkv:
        raise ValueError(f"num_heads ({h}) must be a positive multiple of the cache's num_kv_heads ({hkv})")
    if block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(f"block_tables must be [batch={b}, max_blocks], got {tuple(block_tables.shape)}")
    if seq_lens.shape != (b,):
        raise ValueError(f"seq_lens must be [batch={b}], got {tuple(seq_lens.shape)}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: attention never converts the cache")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ValueError(f"window must be a positive int or None, got {window!r}")


def _check_step(call: AttentionCall) -> None:
    q, k, v, cos, sin, q_norm, k_norm = call.q, call.k, call.v, call.cos, call.sin, call.q_norm, call.k_norm
    k_cache, v_cache, block_tables, seq_lens = call.k_cache, call.v_cache, call.block_tables, call.seq_lens
    tensors = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables, "seq_lens": seq_lens}
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be floating-point (the activation dtype), got {q.dtype}")
    call.check_paged()
    k, v = cast(Tensor, k), cast(Tensor, v)  # tensors: checked above
    b, _, d = q.shape
    hkv = k_cache.shape[2]
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [batch, num_kv_heads, head_dim], got {tuple(k.shape)} and {tuple(v.shape)}")
    if tuple(k.shape) != (b, hkv, d):
        raise ValueError(
            f"k and v must be [batch={b}, num_kv_heads={hkv}, head_dim={d}] (q's batch and head_dim, the cache's "
            f"num_kv_heads), got {tuple(k.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: the new token's q, k, v share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must both be given (RoPE) or both be None (no RoPE)")
    if cos is not None and sin is not None:
        for name, t in (("cos", cos), ("sin", sin)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a tensor or None, got {type(t).__name__}")
            if t.dim() != 2 or t.shape[0] not in (1, b) or t.shape[1] != d:
                raise ValueError(f"{name} must be [batch={b}, head_dim={d}] or [1, head_dim={d}] (one row for every row), got {tuple(t.shape)}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: RoPE runs in the activation dtype")
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
        if cos.shape != sin.shape:
            raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
        if d % 2:
            raise ValueError(f"RoPE needs an even head_dim (rotate_half splits it in halves), got {d}")
    for name, spec in (("q_norm", q_norm), ("k_norm", k_norm)):
        if spec is None:
            continue
        if not isinstance(spec, NormSpec):
            raise TypeError(f"{name} must be an infer_ref.norm.NormSpec or None, got {type(spec).__name__}")
        if tuple(spec.weight.shape) != (d,):
            raise ValueError(f"{name}.weight must be [head_dim={d}] (a per-head norm), got {tuple(spec.weight.shape)}")
        if spec.weight.dtype != q.dtype:
            raise TypeError(f"{name}.weight has dtype {spec.weight.dtype}, q has {q.dtype}: the norm runs in the activation dtype")
        if spec.weight.device != q.device:
            raise ValueError(f"{name}.weight is on {spec.weight.device}, q is on {q.device}")
    # Addresses are not traceable: under torch.compile the check is left to eager calls.
    if not torch.compiler.is_compiling() and overlap(k_cache, v_cache):
        raise ValueError("k_cache and v_cache share memory: a V write would overwrite K (or the reverse)")


@takes_arguments_of(AttentionCall.paged)
def check_decode_args(call: AttentionCall) -> None:
    """:meth:`AttentionCall.check_paged`, called with the paged entry points' arguments."""
    call.check_paged()


@takes_arguments_of(AttentionCall)
def check_decode_attention_args(call: AttentionCall) -> None:
    """:meth:`AttentionCall.check`, called with the decode step's arguments."""
    call.check()


__all__ = ["AttentionCall", "check_decode_args", "check_decode_attention_args"]
