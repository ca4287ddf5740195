"""Matrix-vector products for the decode step: a linear layer and the gated MLP's first half, with
the RMSNorms and the residual add around them folded in.

A decode step multiplies a handful of rows (batch x tokens, usually 1) by each weight matrix, so
it is bound by reading the weights: the work is a GEMV, and cuBLAS reaches well under the copy
bandwidth on the small projections of a 1B model. These kernels read each weight once with enough
programs in flight to saturate HBM.

The definitions (each step rounds to x's dtype exactly where eager torch rounds):

- :func:`linear_reference` ``(x, weight, bias, in_norm=, residual=, out_norm=)``:
  ``h = rms_norm(x, in_norm)`` over K, ``y = F.linear(h, weight, bias)``, ``y = rms_norm(y,
  out_norm)`` over N (the whole output row), ``y = residual + y``; each stage optional, the norms
  are :func:`infer_ref.norm.rms_norm` (the models' norm modules). This is a transformer
  block around its projections: Llama/Qwen ``x + o_proj(attn)`` (residual) and ``gate_up(norm(x))``
  (in_norm), Gemma ``x + post_norm(o_proj(attn))`` (out_norm and residual);
- :func:`gated_mlp_reference` ``(x, weight, act, in_norm=)``: ``weight`` ``[2I, K]`` stacks the gate
  rows then the up rows, and the result is ``act(g) * u`` with ``g, u = F.linear(h, weight).split(I,
  -1)``, ``h`` as above.

The Triton kernel computes ``x [M, K] @ weight[N, K]^T`` in float32 for ``M <= MAX_ROWS`` rows. A
program owns ``BLOCK_N`` output columns and one of ``SPLIT_K`` slices of K; it walks its slice in
``BLOCK_K`` tiles along one of three paths: ``"dot"``, ``tl.dot(x, W^T)`` with the rows padded to
16 (the weight tile pipelined through shared memory over ``num_stages``); ``"dot_t"``, the same
product transposed, ``tl.dot(W, x^T)``, so the weight block is the MMA's M side (the "swap AB" of
small-batch GEMMs: tensor cores prefer many rows there); ``"fma"``, a multiply-and-add into a
``[M, BLOCK_N, BLOCK_K]`` float32 accumulator reduced once at the end (the classic GEMV form). When
K and N divide into whole tiles and blocks, weight loads carry no masks. With one split the
program finishes the output itself; with several, each writes float32 partials ``[SPLIT_K, M, N]``
and a second kernel sums them in split order (deterministic: no atomics) and finishes. Finishing
means: add the bias, round to x's dtype; for the gated variant, where a program owns gate rows
``j`` and up rows ``I + j`` together, round ``g`` and ``u`` to the dtype, compute the activation in
float32 from the rounded ``g`` and round it, multiply the two rounded values in float32 and round —
the roundings eager torch does in bf16, so the kernel differs from the reference only by the order
of the sums (the dot products', and the norms' sums of squares).

The fused stages:

- ``in_norm`` (prologue, every path, any row count): each program first sums the squares of its
  rows of x over ALL of K (also with split K: a slice's own sum would be another norm), then
  normalises each x tile as it loads it: Llama's ``round(w * round(x32 * rstd))`` or Gemma's
  ``round(x32 * rstd * (1 + w32))``, ``rstd = 1 / sqrt(mean(x32^2) + eps)`` per row. Reading x
  twice costs little: it is a few KB, resident in L2 after the first program.
- ``out_norm`` needs every column of a row, so it runs in a combine kernel whose program owns whole
  rows; the main kernel then always writes float32 partials (even with one split). The combine
  sums them in split order, finishes (bias, rounding), sums the squares of the rounded row and
  normalises it.
- ``residual`` ``[..., N]``: ``round(residual32 + round(y))``, last, in whichever kernel finishes
  the output (the main kernel with one split and no out_norm, else the combine).
- ``weight_is_constant``: no earlier kernel of the stream writes the weight, so the program may
  issue its first weight tile's loads before its programmatic-dependent-launch wait
  (``infer_ref/fast/kernels/common.py`` allows loads of constant data there): the first K tile is peeled
  off the loop, loaded before ``pdl_prologue`` and consumed after it, and the weight stream
  overlaps the predecessor's tail. A public call cannot know this, so it is off by default.
- ``residual_is_settled``: the residual was written before the kernel launched just before this
  call (a block's residual stream in a decode step: the sub-layer's own kernels run in between),
  so the program may load its residual tile before its dependency wait too, and the epilogue
  needs no round trip of its own. Off by default, for the same reason. (A combine kernel loads the
  residual and the out_norm weight before its wait in any case: its predecessor is the call's own
  product, which writes only partials.)

:func:`linear` and :func:`gated_mlp` dispatch: the kernel when ``x`` is on CUDA, Triton is
importable, the dtype is bf16/fp16/fp32, the rows fit (``1..MAX_ROWS``), the weight is contiguous
and the decode kernels are switched on (:mod:`infer_ref.fast.switch`); the reference otherwise.
Checks are host-side metadata only and buffers are sized by shapes alone, so a call can be
captured in a CUDA graph.

The package, one concern a module: ``reference.py`` (the definitions, :class:`GemvCall` and the
argument checks), ``tuning.py`` (:class:`GemvConfig` and the tables keyed by device and shape),
``kernel.py`` (the Triton kernels), ``launch.py`` (the launch and the kernels' entry points
:func:`linear_triton`, :func:`gated_mlp_triton`), ``op.py`` (the dispatch and the custom ops).
"""

from infer_ref.fast.kernels.common import HAVE_TRITON
from infer_ref.fast.kernels.gemv.launch import MAX_ROWS, gated_mlp_triton, linear_triton
from infer_ref.fast.kernels.gemv.op import gated_mlp, linear
from infer_ref.fast.kernels.gemv.reference import (
    ACTIVATIONS,
    GemvCall,
    check_gated_args,
    check_linear_args,
    gated_mlp_reference,
    linear_reference,
)
from infer_ref.fast.kernels.gemv.tuning import (
    CUBLAS_SHAPES,
    GATED_CONFIGS,
    LINEAR_CONFIGS,
    PATHS,
    SM90,
    TABLE_ROWS,
    GemvConfig,
    default_config,
    gemv_config,
    prefetched_tiles,
    split_plan,
    target_programs,
)

__all__ = [
    "ACTIVATIONS",
    "CUBLAS_SHAPES",
    "GATED_CONFIGS",
    "HAVE_TRITON",
    "LINEAR_CONFIGS",
    "MAX_ROWS",
    "PATHS",
    "SM90",
    "TABLE_ROWS",
    "GemvCall",
    "GemvConfig",
    "check_gated_args",
    "check_linear_args",
    "default_config",
    "gated_mlp",
    "gated_mlp_reference",
    "gated_mlp_triton",
    "gemv_config",
    "linear",
    "linear_reference",
    "linear_triton",
    "prefetched_tiles",
    "split_plan",
    "target_programs",
]
