"""Device kernels, each beside the torch reference it must equal.

``store_kvcache`` writes K/V rows into a cache through a slot mapping; ``gather_paged_kv`` and
``paged_decode_attention`` read a paged cache through its block tables. Each public function
dispatches to its Triton kernel on CUDA (when Triton is importable) and to the torch reference
everywhere else; the ``*_reference`` functions are the definitions the kernels are tested against.
``contiguous_layer_as_paged`` lets the paged kernel read a contiguous cache layer in place.
``decode_attention.decode_attention`` is one decode step's attention from the projected q/k/v in
one kernel (per-head norms, RoPE, the K/V store, split-K attention and its combine).
``linear`` and ``gated_mlp`` are the decode projections' matrix-vector products; they take their
kernels only while ``decode_kernels()`` is on (the captured decode path), see ``infer_ref/fast/switch.py``.
"""

from infer_ref.fast.switch import decode_kernels, decode_kernels_enabled
from infer_ref.kernels.gemv import gated_mlp, gated_mlp_reference, linear, linear_reference
from infer_ref.kernels.paged_attention import (
    contiguous_layer_as_paged,
    gather_paged_kv,
    paged_decode_attention,
    paged_decode_attention_reference,
)
from infer_ref.kernels.store import store_kvcache, store_kvcache_reference

__all__ = [
    "contiguous_layer_as_paged",
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
