"""Launch configuration of the decode matrix-vector kernels (the ``gemv`` family).

:class:`GemvConfig` holds the knobs of one launch; :func:`gemv_config` picks one for a device, a
weight shape and a row count: the tables keyed by (device capability, weight shape) (the batch-1
winners of ``benchmarks/bench_gemv.py``'s sweep on an H100), else :func:`default_config`'s
heuristic, which fills the device's SMs. :func:`split_plan` turns ``split_k`` into the slices a
launch really runs. Everything here is plain Python: importable without Triton.
"""

from __future__ import annotations

import dataclasses
import math

from infer_ref.fast.kernels.common import DeviceProfile

# Programs the default configuration aims for, per SM of the device: about four (528 on an H100's
# 132 SMs), enough to keep the memory system busy while some programs wait on their loads.
PROGRAMS_PER_SM = 4

PATHS = ("dot", "dot_t", "fma")
# Weight tiles a program may hold before its dependency wait (the kernel peels at most this many).
MAX_PREFETCH_TILES = 2  # described in the package docstring; the kernel's PATH is the index


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Launch knobs of one kernel call.

    ``block_n`` output columns per program (per half for the gated kernel), ``block_k`` the K tile,
    ``split_k`` the K slices (at most; slices are whole tiles, so fewer may be launched),
    ``num_warps``/``num_stages`` as Triton takes them, ``path`` one of :data:`PATHS`,
    ``prefetch_tiles`` the weight tiles a program loads before its dependency wait when the weight
    is constant (1 or 2, at most the slice's tiles: they are held in registers until the wait),
    ``weight_first`` whether the K loop issues each weight tile's loads before the x tile's (which
    order hides the weight stream's latency better depends on the shape: measured per table entry).
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    path: str = "dot"
    prefetch_tiles: int = 1
    weight_first: bool = False

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        # tl.dot's smallest tile is 16 on each side; the multiply-and-add path takes any block.
        smallest = {"block_n": 1 if self.path == "fma" else 16, "block_k": 16}
        for name, low in smallest.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low or value & (value - 1):
                raise ValueError(
                    f"{name} must be a power of two >= {low} on the {self.path!r} path, got {value!r}"
                )
        for name in ("split_k", "num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        tiles = self.prefetch_tiles
        if isinstance(tiles, bool) or not isinstance(tiles, int) or not 1 <= tiles <= MAX_PREFETCH_TILES:
            raise ValueError(
                f"prefetch_tiles must be an int in [1, {MAX_PREFETCH_TILES}] (tiles held in registers before the "
                f"dependency wait), got {self.prefetch_tiles!r}"
            )
        if not isinstance(self.weight_first, bool):
            raise ValueError(f"weight_first must be a bool, got {self.weight_first!r}")
        if self.num_warps not in (1, 2, 4, 8, 16) or isinstance(self.num_warps, bool):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")


# Launch configs per weight shape (N, K): the batch-1 winners of benchmarks/bench_gemv.py's sweep
# on an H100 with programmatic dependent launch, each projection run with the fused stages its
# block gives it and its weight constant (``--stages``: in_norm on qkv and gate_up, residual on o
# and down, plus out_norm for Gemma; benchmarks/log/h100_gemv_stages.json). The comments give the
# time of one call (the combine kernels included) and % of copy bandwidth, kernel vs the eager ops
# it replaces. Where one split came within 2% of the best, it is taken: a second kernel (the
# split-K combine) costs more in a chain of dependent kernels than in the sweep's repeated calls.
# The gated kernel's table is keyed by the stacked [2I, K]. Batch 1 only: the multiply-and-add path
# keeps a [rows, BLOCK_N, BLOCK_K] float32 accumulator, so with more rows gemv_config takes the
# heuristic's tl.dot config instead (see gemv_config).
# Two knobs were set afterwards from the compiled model step (decode_compare.py at 128 positions,
# source trees A/B in one run on one H100; benchmarks/log/DECODE_LOG.md): two weight tiles before
# the dependency wait (the whole slice) for Llama's qkv and the o shape it shares with Qwen3,
# Llama 909.3 -> 919.0 tok/s, Qwen3 645.6 -> 651.8; and the K loop loading the weight tile before
# the x tile for Llama's and Gemma's shapes that loop, Llama 919.6 -> 928.6, Gemma 857.4 -> 889.0
# (Qwen3's shapes keep x first: with every shape weight-first, Qwen3 fell to 616.7).
_FMA_4x1024 = GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma")
_FMA_4x1024_P2 = dataclasses.replace(_FMA_4x1024, prefetch_tiles=2)
_FMA_4x1024_WF = dataclasses.replace(_FMA_4x1024, weight_first=True)
# Keys: (the device's compute capability, the weight shape (N, K)).
SM90 = (9, 0)  # H100, H200: the device the tables were measured on
LINEAR_CONFIGS: dict[tuple[tuple[int, int], tuple[int, int]], GemvConfig] = {
    (SM90, (3072, 2048)): _FMA_4x1024_P2,  # llama qkv: 6.85 us, 62% vs 26% (16x256 in 6 splits: 6.69 us)
    (SM90, (2048, 2048)): _FMA_4x1024_P2,  # llama/qwen3 o: 4.33 us, 65% vs 36%
    (SM90, (2048, 8192)): _FMA_4x1024_WF,  # llama down: 13.48 us, 84% vs 63% (2 splits: 13.45 us)
    (SM90, (128256, 2048)): _FMA_4x1024_WF,  # llama lm_head: 106% vs 95%
    (SM90, (4096, 2048)): _FMA_4x1024,  # qwen3 qkv: 7.58 us, 75% vs 33%
    (SM90, (2048, 6144)): _FMA_4x1024,  # qwen3 down: 10.65 us, 80% vs 57% (2 splits: 10.60 us)
    (SM90, (151936, 2048)): _FMA_4x1024,  # qwen3 lm_head: 106% vs 96%
    (SM90, (1536, 1152)): GemvConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma", weight_first=True),  # gemma qkv: 4.15 us, 29% vs 7%
    (SM90, (1152, 1024)): _FMA_4x1024,  # gemma o (out_norm: partials and a row combine): 3.33 us, 24% vs 5%
    (SM90, (1152, 6912)): GemvConfig(block_n=4, block_k=1024, split_k=4, num_warps=4, num_stages=3, path="fma", weight_first=True),  # gemma down (out_norm): 9.07 us, 59% vs 23%
    (SM90, (262144, 1152)): GemvConfig(block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma", weight_first=True),  # gemma lm_head: 104% vs 96%
}
GATED_CONFIGS: dict[tuple[tuple[int, int], tuple[int, int]], GemvConfig] = {
    (SM90, (16384, 2048)): GemvConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=3, path="dot", weight_first=True),  # llama gate_up: 24.14 us, 94% vs 60%
    (SM90, (12288, 2048)): GemvConfig(block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"),  # qwen3 gate_up: 95% vs 53%
    (SM90, (13824, 1152)): GemvConfig(block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma", weight_first=True),  # gemma gate_up: 84% vs 37%
}
# Shapes whose plain product (no in_norm) keeps F.linear even with the decode kernels on. Under
# torch.compile, Inductor fuses the input RMSNorm into its own reduction for the qkv product (H100,
# Llama's: 5.8-6.4 us, norm included), which the kernel alone (6.2 us) does not beat once the norm
# needs a kernel of its own. Qwen3's qkv has the same structure and stays with it too (not measured
# on its own). A call with ``in_norm`` takes the kernel on these shapes as well: the norm is then in
# its prologue and needs no kernel of its own (``benchmarks/bench_gemv.py --mode chain`` times both).
# Keyed by shape alone: the choice is made where torch.compile traces the call (``op.linear``),
# which reads tensor metadata only and never asks the device (the device tables are read inside
# the custom op, at launch).
CUBLAS_SHAPES: frozenset[tuple[int, int]] = frozenset({(3072, 2048), (4096, 2048)})
# Rows up to which a table config applies (the sweep's batch-1 winners).
TABLE_ROWS = 1


def target_programs(device: DeviceProfile) -> int:
    """Programs the heuristic aims a launch at on ``device``: :data:`PROGRAMS_PER_SM` per SM."""
    return PROGRAMS_PER_SM * device.sm_count


def default_config(n_out: int, k: int, rows: int, *, device: DeviceProfile) -> GemvConfig:
    """The heuristic for shapes the table lacks.

    Columns: 64 per program when that alone gives the device's target programs
    (:func:`target_programs`; the LM head), else 32, so that small matrices still spread over many
    programs. K: tiles of 128 through tl.dot with 4 stages in flight. When the column blocks alone
    are too few (qkv, o and down of a 1B model have 48-96), split K until about the target programs
    run, but keep at least two tiles per split: a shorter split spends more on its partials and its
    pipeline's ramp than it saves.
    """
    target = target_programs(device)
    block_n = 64 if math.ceil(n_out / 64) >= target else 32
    block_k = 128
    column_blocks = math.ceil(n_out / block_n)
    split_k = max(1, min(math.ceil(target / column_blocks), k // (2 * block_k)))
    return GemvConfig(
        block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=4, path="dot"
    )


def gemv_config(n: int, k: int, rows: int, *, gated: bool = False, device: DeviceProfile) -> GemvConfig:
    """The launch configuration on ``device`` for a weight ``[n, k]`` and ``rows`` rows: the
    table's entry for the device's capability and the shape (up to ``TABLE_ROWS`` rows), else the
    heuristic's.

    ``gated``: the weight stacks gate and up rows, so a program's columns are ``n // 2`` wide.
    """
    found = (GATED_CONFIGS if gated else LINEAR_CONFIGS).get((device.capability, (n, k)))
    if found is not None and rows <= TABLE_ROWS:
        return found
    return default_config(n // 2 if gated else n, k, rows, device=device)


def split_plan(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(k_per_split, splits)``: K cut into at most ``split_k`` slices of whole ``block_k`` tiles.

    Every launched slice is non-empty: a request for more slices than tiles launches one per tile.
    """
    tiles = max(1, math.ceil(k / block_k))
    k_per_split = math.ceil(tiles / min(split_k, tiles)) * block_k
    return k_per_split, max(1, math.ceil(k / k_per_split))


def prefetched_tiles(config: GemvConfig, k_per_split: int, weight_is_constant: bool) -> int:
    """Weight tiles a program of this launch loads before its dependency wait: the config's
    ``prefetch_tiles``, at most the slice's tiles, none unless the weight is constant."""
    return min(config.prefetch_tiles, k_per_split // config.block_k) if weight_is_constant else 0


__all__ = [
    "CUBLAS_SHAPES",
    "GATED_CONFIGS",
    "LINEAR_CONFIGS",
    "MAX_PREFETCH_TILES",
    "PATHS",
    "PROGRAMS_PER_SM",
    "SM90",
    "TABLE_ROWS",
    "GemvConfig",
    "default_config",
    "gemv_config",
    "prefetched_tiles",
    "split_plan",
    "target_programs",
]
