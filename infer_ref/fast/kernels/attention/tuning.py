"""Launch planning of the decode attention kernel: the tiling by (device, head dim) and the split
count from the device's SM count and the problem's shape (never the lengths: a launch is planned
on the host from shapes alone, so it can be captured).
"""

from __future__ import annotations

from typing import NamedTuple

from infer_ref.fast.kernels.common import DeviceProfile

SM90 = (9, 0)  # H100, H200: the device the tiling was measured on


class Tile(NamedTuple):
    """A launch's tiling: keys per tile of the attention loop, keys of each split's first tile
    (the one a preloading launch reads before its dependency wait; also every split's fewest keys),
    warps per program, query heads per program (None: a KV head's whole group)."""

    block_n: int
    first_n: int
    num_warps: int
    heads_per_program: int | None = None


# The tiling by head dim, for the decode steps' preloading launches: H100 measurements (one run
# each, 2026-11-24; benchmarks/log/DECODE_LOG.md). benchmarks/bench_decode_attention.py times a
# chain of 16 layers' attention, us a layer at 128 / 4096 / 16384 positions; decode_compare.py the
# compiled model step at 128 positions, where the kernel also shares the GPU with the projections.
# Head dim 64 (Llama-3.2-1B): 64-key first tiles, 16-key tiles on 4 warps: 4.26 / 12.77 us against
# 4.90 / 15.93 for 64-key tiles throughout (the compiled step: 889-908 tok/s in three runs).
# 128 (Qwen3-1.7B): 32-key first tiles, 16-key tiles on 2 warps, the one setting without register
# spills (ptxas): 5.80 / 15.94 / 40.29 us against 5.83 / 22.83 / 49.02 for 32 keys on 4 warps.
# 256 (Gemma-3-1b): a program per query head (multiply-and-sums), 16-key tiles on 4 warps: 5.12 /
# 8.60 / 16.66 us at 128 / 1024 / 4096 against 8.22 / 23.48 / 33.08 for its group of 4 heads on
# tensor cores (padded to 16 rows: 222 registers a thread); on 2 warps 5.62 / 8.90 / 15.92; the
# compiled step 885.7 against 787.7 tok/s in one run, 888.2 in another. A program per head was
# slower for Llama (4.82 / 11.75 / 36.57 against 4.30 / 7.40 / 12.89 us; the step 907.4 against
# 921.9) and Qwen3 (5.30 / 10.45 / 25.97 against 5.81 / 8.80 / 16.39; 608.1 against 616.7):
# their groups on tensor cores share each K/V tile among more heads per read.
# Keys: (the device's compute capability, the head dim padded to a power of two).
TILES: dict[tuple[tuple[int, int], int], Tile] = {
    (SM90, 64): Tile(16, 64, 4),
    (SM90, 128): Tile(16, 32, 2),
    (SM90, 256): Tile(16, 16, 4, 1),
}
# A device with no entries of its own starts from the measured one's (no heuristic exists for tiles).
MEASURED_ON = SM90


def default_tile(head_dim: int, device: DeviceProfile) -> Tile:
    """The :class:`Tile` on ``device`` for a head dim (padded to a power of two; the largest entry
    above 256, the smallest below 64)."""
    dim_pad = 1 << (max(head_dim, 1) - 1).bit_length()  # the next power of two
    capability = device.capability if any(cap == device.capability for cap, _ in TILES) else MEASURED_ON
    return TILES[capability, min(max(dim_pad, 64), 256)]


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
    tile itself (keys, warps) depends on the head dim: :func:`default_tile`.
    """
    wanted = -(-4 * sm_count // max(1, batch * head_blocks))
    useful = max(1, -(-max_visible // min_chunk))
    return max(1, min(wanted, useful, 128))


# Splits whose partials the combine loads at once: [chunk, group, head_dim] float32 elements, about
# 4096 of them (32 registers a thread on 4 warps).
COMBINE_ELEMENTS = 4096


def _next_power_of_2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def combine_chunk(heads: int, dim_pad: int, num_splits: int) -> int:
    """Splits the in-kernel combine loads at once (about :data:`COMBINE_ELEMENTS` partial values)."""
    per_split = _next_power_of_2(heads) * dim_pad
    return max(1, min(_next_power_of_2(num_splits), COMBINE_ELEMENTS // per_split))


__all__ = ["COMBINE_ELEMENTS", "MEASURED_ON", "SM90", "TILES", "Tile", "combine_chunk", "decode_num_splits", "default_tile"]
