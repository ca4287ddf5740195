"""The KV store: write K/V rows into a cache through a slot mapping.

A cache here is any 4-D tensor ``[outer, inner, Hkv, D]`` with arbitrary strides; slot ``s`` is row
``(s // inner, s % inner)``. Two layouts use it:

- the paged pool of one layer, ``[num_blocks, block_size, Hkv, D]``: slot
  ``block_table[pos // bs] * bs + pos % bs``;
- the contiguous cache of one layer, ``[B, Hkv, S, D]`` seen as ``[B, S, Hkv, D]`` (a permuted view,
  no copy): slot ``b * S + pos``.

A slot of ``-1`` writes nothing (a prefix-cache hit, a padding row). It must never be used as an
index: Python and torch read ``-1`` as "the last slot", which silently overwrites a live entry.

:func:`store_kvcache_reference` is the definition; :func:`store_kvcache` runs the Triton kernel on
CUDA when Triton is importable and the reference everywhere else. Both check shapes, dtypes, devices
and aliasing on the host from metadata alone; only the reference also checks slot *values* (range,
duplicates), because reading them on the host would synchronise with the device. The kernel never
writes outside the cache: a slot outside ``[0, outer * inner)`` writes nothing there.

The package: ``reference.py`` (the checks and the definition), ``kernel.py`` (the Triton kernel),
``launch.py`` (its launch and the dispatching :func:`store_kvcache`). No tuning table (one program
per token, the block the next powers of two of the heads and the head dim) and no custom op: under
``torch.compile`` the decode steps store through their own ops.
"""

from infer_ref.fast.kernels.store.launch import store_kvcache, store_kvcache_triton
from infer_ref.fast.kernels.store.reference import check_store_args, store_kvcache_reference

__all__ = ["check_store_args", "store_kvcache", "store_kvcache_reference", "store_kvcache_triton"]
