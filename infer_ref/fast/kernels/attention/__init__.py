"""Decode attention: one kernel from the projected q/k/v of one new token to its attention output.

Between a decode step's qkv projection and its output projection a layer used to run a chain of
small kernels: the per-head q/k RMSNorms (Qwen3, Gemma 3), RoPE, copies, the K/V store, the split
attention kernel and its combine kernel. Here all of it is one launch.

The definition is :func:`decode_attention_reference` (``reference.py``, beside the paged reads and
:func:`paged_decode_attention_reference`).

The kernel (flash-decoding, grid ``(B * head blocks, NUM_SPLITS)``; a head block is the GROUP query
heads of one KV head, or ``heads_per_program`` of them):

- a program taking a whole group runs its two products (``q k^T``, ``p v``) on tensor cores, the
  query block padded to tl.dot's 16 rows; one taking a part of a group runs them as float32
  multiply-and-sums without padding, and reads its KV head's keys itself (the other programs of
  the group read the same ones, mostly from L2). Gemma-3-1b's 4 heads of 256 take a program each:
  padded to 16 rows, they held ~220 registers a thread (``tuning.TILES``);
- every program loads its query heads and normalises and rotates them in
  registers, reproducing eager torch's roundings in the activation dtype (the norm per
  ``norm.py``; RoPE as ``round(round(x * cos) + round(rotate_half(x) * sin))``, each product of two
  bf16/fp16 numbers exact in float32, so the rotation is bit-exact; float32 launches turn off
  multiply-add contraction, which would round ``x * cos + r * sin`` once instead of three times).
  ``rotate_half`` pairs element ``e`` with ``e ± D/2``: the kernel loads those partners too and
  normalises them with the same per-head ``rstd``, so no register shuffles are needed;
- it also prepares the new token's key (k_norm, RoPE) and takes its value as is. The program whose
  split holds position ``n - 1`` (the last non-empty split, the "owner"), of its KV head's first
  head block, stores both into the pool slot, after its attention loop; attention never reads that slot back: in the tile holding
  ``n - 1`` the registers replace the (masked, unread) row, so no program depends on another's
  store (no read-after-write hazard inside the launch);
- each program runs an online softmax in float32 over its share of the visible keys (a first
  tile of ``first_n`` keys, then tiles of ``block_n``; ``NUM_SPLITS`` fixed on the host from
  shapes, each program reading ``seq_lens`` on the device and returning at once when its split is
  empty); table entries past ``ceil(n / bs)`` and slots outside ``[n - window, n)`` are never read;
- the combine happens in the same launch: each non-empty split writes float32 partials (output,
  max, sum) and increments a per-``(row, head block)`` arrival counter (one atomic, acq_rel at gpu
  scope, after a barrier so every thread's partial stores are ordered before it); the program that
  arrives last combines the partials in split order (the same arithmetic whoever is last:
  deterministic), writes ``[B, H, D]`` and resets the counter to zero for the next launch. Partials
  are loaded with ``.cg`` (L2, not a possibly stale L1 line). A row whose visible keys fit in one
  split, and every launch with ``NUM_SPLITS == 1``, skips partials and counter entirely.

The preload (``preload=True``; the decode steps launch with it). With programmatic dependent
launch (``infer_ref/fast/kernels/common.py``) the kernel may start
while the one before it (the layer's qkv projection) still runs; until its dependency wait only
data no earlier kernel is still writing may be read. The bulk of the kernel's reads, the cached
K/V of positions before ``n - 1``, is such data in a model's step: only this kernel writes them,
one step earlier. So each split reads its first tile (``first_n`` keys, :class:`Tile`) before the
wait, through the lengths and the block table as they read then, clamped into the table and the
pool (an unwritten or stale value only reads somewhere harmless). After the wait it reads the
length and those table entries again with q/k/v (no extra round trip); if either changed (the
kernel before was writing them), the tile is read again. A split's first tile is also its
fewest keys, so short rows are one preloaded tile per split; the loop takes ``block_n`` keys at a
time after it. Measured on an H100 (one run, a chain of 16 layers): Llama-3.2-1B's attention at
128 positions 4.90 us a layer against 5.38 without the preload, at 4096 15.93 against 19.31.

The counters (``[B * head blocks]`` int32, zero between launches) are allocated once per (device, size)
and kept, so a CUDA graph captures their address; the first call of a shape must come before a
capture (it allocates them), which is what every caller's warm-up does. Two launches of the same
``B * head blocks`` on one device must not run concurrently on different streams (they share counters).

With the prep stages switched off by constexprs (no norm, no RoPE, no new K/V) the same kernel
serves :func:`paged_decode_attention`: there is one decode attention kernel in the codebase, and
one custom op per operation (``op.py``). :func:`contiguous_layer_as_paged` (``layout.py``) lets it
read a contiguous cache layer in place.

The package, one concern a module: ``checks.py`` (:class:`AttentionCall`, the arguments every
entry point takes, and its host checks), ``reference.py`` (the definitions and the paged reads),
``layout.py``, ``tuning.py`` (the tiling by device and head dim, the split count), ``kernel.py``
(the Triton kernel), ``launch.py`` (:class:`LaunchKnobs`, the launch and the kernel's entry
points), ``op.py`` (the dispatch and the custom ops).
"""

from infer_ref.fast.kernels.attention.checks import (
    AttentionCall,
    check_decode_args,
    check_decode_attention_args,
)
from infer_ref.fast.kernels.attention.launch import (
    LaunchKnobs,
    decode_attention_triton,
    paged_decode_attention_triton,
)
from infer_ref.fast.kernels.attention.layout import contiguous_layer_as_paged
from infer_ref.fast.kernels.attention.op import decode_attention, paged_decode_attention
from infer_ref.fast.kernels.attention.reference import (
    decode_attention_reference,
    gather_paged_kv,
    gather_slots,
    paged_decode_attention_reference,
    slots_through_tables,
)
from infer_ref.fast.kernels.attention.tuning import Tile, decode_num_splits, default_tile
from infer_ref.fast.kernels.common import HAVE_TRITON

__all__ = [
    "HAVE_TRITON",
    "AttentionCall",
    "LaunchKnobs",
    "Tile",
    "check_decode_args",
    "check_decode_attention_args",
    "contiguous_layer_as_paged",
    "decode_attention",
    "decode_attention_reference",
    "decode_attention_triton",
    "decode_num_splits",
    "default_tile",
    "gather_paged_kv",
    "gather_slots",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "paged_decode_attention_triton",
    "slots_through_tables",
]
