"""Reading a paged cache through its block tables.

A layer's pool is ``[num_blocks, block_size, Hkv, D]``; row ``b`` of a batch owns the blocks
``block_tables[b, :ceil(len_b / bs)]``, position ``p`` living at block ``block_tables[b, p // bs]``,
offset ``p % bs``. Entries of a table past ``ceil(len_b / bs)`` are never read, whatever they hold
(stale ids, ``-1``): a reader that looks at them is wrong.

:func:`gather_paged_kv` is the reference read (copy the prefix out, contiguous); it is also what
``PagedKVCache.update`` returns on the general path. :func:`paged_decode_attention_reference`
attends one query row per sequence over the gathered prefix; the Triton kernel behind
:func:`paged_decode_attention` reads K/V through the table without gathering and must equal it.

The kernel is the fused decode attention kernel of :mod:`infer_ref.kernels.decode_attention`
with its prep stages (per-head norms, RoPE, the new token's K/V store) switched off: flash-decoding,
programs ``(row, kv head, split)`` each running an online softmax in float32 over one chunk of the
row's visible keys (all query heads of the KV head at once, so K/V are read once per group), the
splits combined in the same launch by the last one to finish. The number of splits is fixed on the
host from shapes alone (the table's capacity, the window, the GPU's SM count: :func:`decode_num_splits`);
each program reads ``seq_lens`` on the device and takes its share of the visible range, so the call
never reads lengths on the host and can be captured in a CUDA graph. A sliding-window layer only
visits its window ``[len - window, len)``.

Every stride is a parameter, which lets the same kernel read a contiguous static-cache layer
``[B, Hkv, S, D]`` through an identity table: see :func:`contiguous_layer_as_paged`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from infer_ref.cache.slots import gather_slots, slots_through_tables

try:  # Triton is optional: absent on CPU-only installs, where the reference serves every call.
    import triton  # noqa: F401  # only whether it imports: the kernel lives in decode_attention.py

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the kernel takes; others: the reference


def gather_paged_kv(cache: Tensor, block_tables: Tensor, length: int) -> Tensor:
    """The first ``length`` positions of every row, contiguous: ``[B, Hkv, length, D]``.

    Args:
        cache: one layer's pool ``[num_blocks, block_size, Hkv, D]``.
        block_tables: ``[B, M]`` integer block ids, ``M >= ceil(length / block_size)``.
        length: positions to read (the same for every row).
    """
    block_size = cache.shape[1]
    needed = -(-length // block_size)
    if block_tables.dim() != 2 or block_tables.shape[1] < needed:
        raise ValueError(f"block_tables must be [B, M>={needed}] for {length} positions, got {tuple(block_tables.shape)}")
    positions = torch.arange(length, device=block_tables.device).expand(block_tables.shape[0], -1)  # [B, S]
    return gather_slots(cache, slots_through_tables(block_tables, positions, block_size))


def paged_decode_attention_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
) -> Tensor:
    """One query row per sequence over its paged prefix, in float32 (float64 for float64 inputs): ``[B, H, D]``.

    Args:
        q: ``[B, H, D]``, the query at position ``seq_lens[b] - 1`` (its own K/V already stored).
        k_cache, v_cache: one layer's pool ``[num_blocks, block_size, Hkv, D]``.
        block_tables: ``[B, M]`` block ids.
        seq_lens: ``[B]`` positions held per row, including the query's own.
        scale: softmax scale.
        window: sliding window (keys at distance ``< window`` visible) or None.

    Query head ``h`` reads KV head ``h // (H / Hkv)``.
    """
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty_like(q)
    acc = torch.promote_types(q.dtype, torch.float32)  # never below float32
    for row in range(b):
        n = int(seq_lens[row])
        k = gather_paged_kv(k_cache, block_tables[row : row + 1], n)[0].to(acc)  # [Hkv, n, D]
        v = gather_paged_kv(v_cache, block_tables[row : row + 1], n)[0].to(acc)
        first = 0 if window is None else max(0, n - window)
        k, v = k[:, first:], v[:, first:]
        qg = q[row].to(acc).view(hkv, h // hkv, d)  # [Hkv, G, D]
        scores = torch.einsum("kgd,ksd->kgs", qg, k) * scale  # [Hkv, G, S]
        out[row] = torch.einsum("kgs,ksd->kgd", F.softmax(scores, dim=-1), v).reshape(h, d).to(q.dtype)
    return out


def check_decode_args(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None,
) -> None:
    """Shapes, dtypes, devices and scalars (host metadata only: no device synchronisation)."""
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


def contiguous_layer_as_paged(layer: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """A contiguous cache layer ``[B, Hkv, S, D]`` as a paged pool and its identity block tables.

    Returns ``(pool, block_tables)``: ``pool`` is a strided *view* of ``layer`` (no copy) shaped
    ``[num_blocks, block_size, Hkv, D]`` with strides ``(bs*D, D, S*D, 1)`` (in elements), and
    ``block_tables[b, c] = b * (Hkv * S / bs) + c`` for ``c < S / bs``. Checking the arithmetic:
    block ``b*(Hkv*S/bs) + c``, offset ``o``, head ``h``, dim ``e`` lands at
    ``(b*(Hkv*S/bs) + c)*bs*D + o*D + h*S*D + e = b*Hkv*S*D + h*S*D + (c*bs + o)*D + e``, which is
    exactly ``layer[b, h, c*bs + o, e]``. Blocks overlap in memory (block ``k`` of one row and head
    is also part of other heads' rows); only the identity ids are ever read. ``num_blocks`` is
    ``(B-1)*Hkv*S/bs + S/bs``: the last row's head-0 blocks are the highest ids, and their head
    ``Hkv-1`` entries end at the layer's last element, so the view stays inside the storage.

    Args:
        layer: ``[B, Hkv, S, D]`` with a contiguous last dimension and ``S`` a multiple of
            ``block_size`` (a static cache layer, or ``KVCache.k[layer]``).
        block_size: positions per block; ``S`` itself gives one block per row.
    """
    if layer.dim() != 4:
        raise ValueError(f"layer must be [batch, num_kv_heads, max_seq_len, head_dim], got {tuple(layer.shape)}")
    b, hkv, s, d = layer.shape
    if not layer.is_contiguous():
        raise ValueError(f"layer must be contiguous (strides {layer.stride()}): the identity table assumes [B, Hkv, S, D] packing")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0 or s % block_size:
        raise ValueError(f"block_size must be a positive divisor of max_seq_len {s}, got {block_size!r}")
    per_row = s // block_size  # blocks of one (row, head)
    blocks_per_batch_row = hkv * per_row
    num_blocks = (b - 1) * blocks_per_batch_row + per_row
    pool = layer.as_strided((num_blocks, block_size, hkv, d), (block_size * d, d, s * d, 1))
    return pool, _identity_tables(b, blocks_per_batch_row, per_row, layer.device)


# Identity tables depend on shapes only; built once each (the first call comes before a CUDA graph
# capture, so a captured decode step never allocates or launches for them).
_IDENTITY_TABLES: dict[tuple[int, int, int, torch.device], Tensor] = {}


def _identity_tables(batch: int, blocks_per_batch_row: int, per_row: int, device: torch.device) -> Tensor:
    """``[B, per_row]`` int32: ``tables[b, c] = b * blocks_per_batch_row + c`` (never written to)."""
    key = (batch, blocks_per_batch_row, per_row, device)
    if key not in _IDENTITY_TABLES:
        rows = torch.arange(batch, device=device, dtype=torch.int32)[:, None]
        _IDENTITY_TABLES[key] = rows * blocks_per_batch_row + torch.arange(per_row, device=device, dtype=torch.int32)[None, :]
    return _IDENTITY_TABLES[key]


@functools.cache
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def decode_num_splits(batch: int, head_blocks: int, max_visible: int, min_chunk: int, sm_count: int) -> int:
    """Splits per ``(row, head block)`` (a head block: a KV head's group of query heads, or the part
    of it one program takes): enough programs for about four waves of the GPU, but no split shorter
    than ``min_chunk`` keys (a split's first tile) of the longest possible visible range (shapes
    only, no lengths).

    Of twelve settings tried on an H200 (2, 4 or 8 waves; 32-key tiles on 2 warps, 64 on 4 or 8,
    128 on 4) over batch 1..64, contexts 1K..16K and the three families' shapes, four waves was the
    best single one: within 4% of each case's best on geometric mean, 11% at worst. One tile per
    split rather than two: on an H100, batch 1, Llama-3.2-1B's 8 KV heads at 4096 positions, 66
    splits of one tile took 7.7 us per layer against 8.7 us for 33 of two (``DECODE_LOG.md``). The
    tile itself (keys, warps) depends on the head dim: ``decode_attention.default_tile``.
    """
    wanted = -(-4 * sm_count // max(1, batch * head_blocks))
    useful = max(1, -(-max_visible // min_chunk))
    return max(1, min(wanted, useful, 128))


def paged_decode_attention_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
    num_splits: int | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> Tensor:
    """The Triton kernel (CUDA tensors): the fused decode attention kernel with its prep stages off.
    ``num_splits`` overrides the split heuristic (tests use it); ``block_n`` (keys per tile),
    ``num_warps`` and ``num_stages`` are launch knobs for tuning.

    Host checks only: no sync, allocations sized by shapes alone, so the call can be captured once
    a first call of the shape has allocated the arrival counters (``decode_attention.py``).
    ``seq_lens`` must be in ``[1, M * block_size]`` and table entries valid block ids; the kernel
    cannot check values without a sync (the reference does).
    """
    # Imported here: decode_attention.py imports this module (the references, decode_num_splits).
    from infer_ref.kernels.decode_attention import launch_decode_attention

    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    return launch_decode_attention(
        q, None, None, None, None, k_cache, v_cache, block_tables, seq_lens, scale, window, None, None,
        num_splits, block_n, num_warps, num_stages,
    )  # fmt: skip


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    window: int | None = None,
) -> Tensor:
    """:func:`paged_decode_attention_reference`'s contract (the dispatching entry point).

    On CUDA with Triton (bf16/fp16/fp32): the split-K kernel (capturable; lengths stay on the
    device), called through the custom op ``infer_ref::paged_decode_attention`` so ``torch.compile``
    keeps it as one opaque node instead of tracing the launch. Elsewhere: the reference.
    """
    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    if HAVE_TRITON and q.is_cuda and q.dtype in _KERNEL_DTYPES:
        return torch.ops.infer_ref.paged_decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, float(scale), 0 if window is None else window
        )
    return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale, window)


def contiguous_decode_attention(
    q: Tensor, k_layer: Tensor, v_layer: Tensor, seq_lens: Tensor, scale: float, window: int | None = None
) -> Tensor:
    """One query row per sequence over a contiguous layer ``[B, Hkv, S, D]``, the first
    ``seq_lens[b]`` positions of row ``b`` (lengths on the device): ``[B, H, D]``.

    The same kernel as :func:`paged_decode_attention`, reading the layer in place through identity
    block tables (:func:`contiguous_layer_as_paged`). The op takes the layer itself, not the
    overlapping strided view, so a compiler never sees (or copies) that view.
    """
    if k_layer.shape != v_layer.shape or k_layer.dim() != 4:
        raise ValueError(f"k_layer and v_layer must both be [batch, num_kv_heads, max_seq_len, head_dim], got {tuple(k_layer.shape)} and {tuple(v_layer.shape)}")
    if HAVE_TRITON and q.is_cuda and q.dtype in _KERNEL_DTYPES:
        return torch.ops.infer_ref.contiguous_decode_attention(
            q, k_layer, v_layer, seq_lens, float(scale), 0 if window is None else window
        )
    return _contiguous_decode(q, k_layer, v_layer, seq_lens, scale, window)


def _identity_block_size(max_seq_len: int) -> int:
    # Any divisor of S serves; 64 keeps the table reads few (FastDecoder rounds S up to 64).
    return 64 if max_seq_len % 64 == 0 else max_seq_len


def _contiguous_decode(q: Tensor, k_layer: Tensor, v_layer: Tensor, seq_lens: Tensor, scale: float, window: int | None) -> Tensor:
    block = _identity_block_size(k_layer.shape[2])
    k_pool, tables = contiguous_layer_as_paged(k_layer, block)
    v_pool, _ = contiguous_layer_as_paged(v_layer, block)
    return paged_decode_attention(q, k_pool, v_pool, tables, seq_lens, scale, window)


# -- custom ops (torch.compile sees each kernel as one node; CUDA graphs capture the launches) ------


@torch.library.custom_op("infer_ref::paged_decode_attention", mutates_args=())
def _paged_decode_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, window: int
) -> Tensor:
    return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, window or None)


@_paged_decode_op.register_fake
def _paged_decode_fake(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, window: int
) -> Tensor:
    return q.new_empty(q.shape)  # contiguous, as the kernel's output


@torch.library.custom_op("infer_ref::contiguous_decode_attention", mutates_args=())
def _contiguous_decode_op(q: Tensor, k_layer: Tensor, v_layer: Tensor, seq_lens: Tensor, scale: float, window: int) -> Tensor:
    return _contiguous_decode(q, k_layer, v_layer, seq_lens, scale, window or None)


@_contiguous_decode_op.register_fake
def _contiguous_decode_fake(q: Tensor, k_layer: Tensor, v_layer: Tensor, seq_lens: Tensor, scale: float, window: int) -> Tensor:
    return q.new_empty(q.shape)


__all__ = [
    "check_decode_args",
    "contiguous_decode_attention",
    "contiguous_layer_as_paged",
    "gather_paged_kv",
    "gather_slots",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "slots_through_tables",
]
