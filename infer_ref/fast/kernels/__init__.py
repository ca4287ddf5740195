"""Device kernels, each beside the torch reference it must equal, one family a package.

- :mod:`infer_ref.fast.kernels.gemv`: the decode projections' matrix-vector products, ``linear`` and
  ``gated_mlp`` (RMSNorms and the residual add folded in); they take their kernels only while
  ``decode_kernels()`` is on (the captured decode path), see ``switch.py``.
- :mod:`infer_ref.fast.kernels.attention`: decode attention. ``decode_attention`` is one decode step's
  attention from the projected q/k/v in one kernel (per-head norms, RoPE, the K/V store, split-K
  attention and its combine); ``paged_decode_attention`` the same kernel over a stored prefix,
  read through the block tables; ``gather_paged_kv`` the reference read of a paged cache;
  ``contiguous_layer_as_paged`` lets the kernel read a contiguous cache layer in place.
- :mod:`infer_ref.fast.kernels.store`: ``store_kvcache`` writes K/V rows into a cache through a slot mapping.
- :mod:`infer_ref.fast.kernels.common`: what the families share (Triton's presence, programmatic
  dependent launch, the device profile the tuning tables are keyed by, the memory checks).

Each family's package holds ``reference.py`` (the definitions the kernels are tested against, the
``*_reference`` functions), ``kernel.py`` (Triton), ``launch.py``, and where it has them
``tuning.py`` and ``op.py`` (the dispatch and its custom ops). Each public function dispatches to
its Triton kernel on CUDA (when Triton is importable) and to the torch reference everywhere else.
"""

from infer_ref.fast.kernels.attention import (
    contiguous_layer_as_paged,
    decode_attention,
    decode_attention_reference,
    decode_attention_triton,
    gather_paged_kv,
    paged_decode_attention,
    paged_decode_attention_reference,
)
from infer_ref.fast.kernels.gemv import ACTIVATIONS, gated_mlp, gated_mlp_reference, linear, linear_reference
from infer_ref.fast.kernels.store import store_kvcache, store_kvcache_reference
from infer_ref.fast.switch import decode_kernels, decode_kernels_enabled

__all__ = [
    "ACTIVATIONS",
    "contiguous_layer_as_paged",
    "decode_attention",
    "decode_attention_reference",
    "decode_attention_triton",
    "decode_kernels",
    "decode_kernels_enabled",
    "gated_mlp",
    "gated_mlp_reference",
    "gather_paged_kv",
    "linear",
    "linear_reference",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "store_kvcache",
    "store_kvcache_reference",
]
