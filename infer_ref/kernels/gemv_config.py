"""Launch configuration of the decode matrix-vector kernels (``infer_ref/kernels/gemv.py``).

:class:`GemvConfig` holds the knobs of one launch; :func:`gemv_config` picks one for a weight shape
and a row count: the per-shape tables (the batch-1 winners of ``benchmarks/bench_gemv.py``'s sweep
on an H100), else :func:`default_config`'s heuristic. :func:`split_plan` turns ``split_k`` into the
slices a launch really runs. Everything here is plain Python: importable without Triton.
"""

from __future__ import annotations

import dataclasses
import math

from infer_ref.config import ModelConfig

# Programs the default configuration aims for: about four per SM of an H100 (132 SMs), enough to
# keep the memory system busy while some programs wait on their loads.
TARGET_PROGRAMS = 4 * 132

PATHS = ("dot", "dot_t", "fma")  # described in gemv.py's docstring; the kernel's PATH is the index


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Launch knobs of one kernel call.

    ``block_n`` output columns per program (per half for the gated kernel), ``block_k`` the K tile,
    ``split_k`` the K slices (at most; slices are whole tiles, so fewer may be launched),
    ``num_warps``/``num_stages`` as Triton takes them, ``path`` one of :data:`PATHS`.
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    path: str = "dot"

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
        if self.num_warps not in (1, 2, 4, 8, 16) or isinstance(self.num_warps, bool):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")


# Launch configs per weight shape (N, K): the batch-1 winners of benchmarks/bench_gemv.py's sweep
# on an H100 with programmatic dependent launch (benchmarks/log/h100_gemv.json; the comments give %
# of copy bandwidth, kernel vs cuBLAS). The gated kernel's table is keyed by the stacked [2I, K].
# Batch 1 only: the multiply-and-add path keeps a [rows, BLOCK_N, BLOCK_K] float32 accumulator, so
# with more rows gemv_config takes the heuristic's tl.dot config instead (see gemv_config).
LINEAR_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (3072, 2048): GemvConfig(
        block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # llama qkv: 68 vs 57
    (2048, 2048): GemvConfig(
        block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # llama/qwen3 o: 58 vs 44
    (2048, 8192): GemvConfig(
        block_n=8, block_k=512, split_k=3, num_warps=4, num_stages=3, path="fma"
    ),  # llama down: 81 vs 69
    (128256, 2048): GemvConfig(
        block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # llama lm_head: 105 vs 94
    (4096, 2048): GemvConfig(
        block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # qwen3 qkv: 75 vs 64
    (2048, 6144): GemvConfig(
        block_n=8, block_k=512, split_k=3, num_warps=4, num_stages=3, path="fma"
    ),  # qwen3 down: 77 vs 63
    (151936, 2048): GemvConfig(
        block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # qwen3 lm_head: 105 vs 96
    (1536, 1152): GemvConfig(
        block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # gemma qkv: 34 vs 24
    (1152, 1024): GemvConfig(
        block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3, path="fma"
    ),  # gemma o: 33 vs 18
    (1152, 6912): GemvConfig(
        block_n=8, block_k=512, split_k=4, num_warps=4, num_stages=3, path="fma"
    ),  # gemma down: 67 vs 49
    (262144, 1152): GemvConfig(
        block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"
    ),  # gemma lm_head: 105 vs 95
}
GATED_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (16384, 2048): GemvConfig(
        block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4, path="dot_t"
    ),  # llama gate_up: 93 vs 78
    (12288, 2048): GemvConfig(
        block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"
    ),  # qwen3 gate_up: 92 vs 73
    (13824, 1152): GemvConfig(
        block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=2, path="fma"
    ),  # gemma gate_up: 86 vs 62
}
# Shapes whose plain product (no in_norm) keeps F.linear even with the decode kernels on. Under
# torch.compile, Inductor fuses the input RMSNorm into its own reduction for the qkv product (H100,
# Llama's: 5.8-6.4 us, norm included), which the kernel alone (6.2 us) does not beat once the norm
# needs a kernel of its own. Qwen3's qkv has the same structure and stays with it too (not measured
# on its own). A call with ``in_norm`` takes the kernel on these shapes as well: the norm is then in
# its prologue and needs no kernel of its own (``benchmarks/bench_gemv.py --mode chain`` times both).
CUBLAS_SHAPES: frozenset[tuple[int, int]] = frozenset({(3072, 2048), (4096, 2048)})
# Rows up to which a table config applies (the sweep's batch-1 winners).
TABLE_ROWS = 1


def decode_projections(config: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """The weight shapes ``(N, K, gated)`` a decode step of ``config`` multiplies by, by projection.

    ``qkv`` and ``gate_up`` are the stacked matrices of ``PackedLinear``; ``gate_up`` runs gated.
    """
    e, d = config.hidden_size, config.computed_head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {
        "qkv": (q + 2 * kv, e, False),
        "o": (e, q, False),
        "gate_up": (2 * config.intermediate_size, e, True),
        "down": (e, config.intermediate_size, False),
        "lm_head": (config.vocab_size, e, False),
    }


@dataclasses.dataclass(frozen=True)
class FusedStages:
    """The fused stages a decode projection takes in a model's block (``gemv.linear``'s arguments):
    ``in_norm`` (the block's input norm), ``residual``, ``out_norm`` (Gemma's post-norms), and the
    norms' formula (``unit_offset``: Gemma's ``1 + w``)."""

    in_norm: bool = False
    residual: bool = False
    out_norm: bool = False
    unit_offset: bool = False


def decode_stages(config: ModelConfig) -> dict[str, FusedStages]:
    """Per projection of :func:`decode_projections`, the stages its block folds into it.

    Llama/Qwen (``x + attn(norm(x))``, ``x + mlp(norm(x))``): qkv and gate_up read the normed
    stream (in_norm), o and down add to it (residual). Gemma 3 (``x + post_norm(sublayer(pre_norm(x)))``):
    the same, and o and down normalise their output first (out_norm). The LM head takes none: the
    model applies the final norm itself (one small kernel per step), because an in_norm prologue
    would have each of the LM head's ~16k programs read the whole hidden row once more.
    """
    gemma = config.model_type == "gemma3_text"
    pre = FusedStages(in_norm=True, unit_offset=gemma)
    post = FusedStages(residual=True, out_norm=gemma, unit_offset=gemma)
    return {"qkv": pre, "o": post, "gate_up": pre, "down": post, "lm_head": FusedStages()}


def default_config(n_out: int, k: int, rows: int) -> GemvConfig:
    """The heuristic for shapes the table lacks.

    Columns: 64 per program when that alone gives TARGET_PROGRAMS programs (the LM head), else 32,
    so that small matrices still spread over many programs. K: tiles of 128 through tl.dot with 4
    stages in flight. When the column blocks alone are too few (qkv, o and down of a 1B model have
    48-96), split K until about TARGET_PROGRAMS programs run, but keep at least two tiles per split:
    a shorter split spends more on its partials and its pipeline's ramp than it saves.
    """
    block_n = 64 if math.ceil(n_out / 64) >= TARGET_PROGRAMS else 32
    block_k = 128
    column_blocks = math.ceil(n_out / block_n)
    split_k = max(1, min(math.ceil(TARGET_PROGRAMS / column_blocks), k // (2 * block_k)))
    return GemvConfig(
        block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=4, path="dot"
    )


def gemv_config(n: int, k: int, rows: int, *, gated: bool = False) -> GemvConfig:
    """The launch configuration for a weight ``[n, k]`` and ``rows`` rows: the table's (up to
    ``TABLE_ROWS`` rows), else the heuristic's.

    ``gated``: the weight stacks gate and up rows, so a program's columns are ``n // 2`` wide.
    """
    found = (GATED_CONFIGS if gated else LINEAR_CONFIGS).get((n, k))
    if found is not None and rows <= TABLE_ROWS:
        return found
    return default_config(n // 2 if gated else n, k, rows)


def split_plan(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(k_per_split, splits)``: K cut into at most ``split_k`` slices of whole ``block_k`` tiles.

    Every launched slice is non-empty: a request for more slices than tiles launches one per tile.
    """
    tiles = max(1, math.ceil(k / block_k))
    k_per_split = math.ceil(tiles / min(split_k, tiles)) * block_k
    return k_per_split, max(1, math.ceil(k / k_per_split))


__all__ = [
    "CUBLAS_SHAPES",
    "GATED_CONFIGS",
    "LINEAR_CONFIGS",
    "PATHS",
    "TABLE_ROWS",
    "TARGET_PROGRAMS",
    "FusedStages",
    "GemvConfig",
    "decode_projections",
    "decode_stages",
    "default_config",
    "gemv_config",
    "split_plan",
]
