"""KV caches: contiguous, static-shape, dynamic (grows by concatenation), paged (blocks
of a shared pool), and frozen snapshots of any of them.

Every cache keeps one contract (``cache/protocol.py``): ``update`` writes a layer's new K/V and
returns what the layer holds, ``advance`` commits the positions once every layer wrote. A model's
logits must not depend on which cache holds the prefix or how it got there.

Its names are imported on first use (``infer_ref._lazy``), so ``infer_ref.cache.kinds`` (the names
the command line offers) loads without torch.
"""

from typing import TYPE_CHECKING

from infer_ref._lazy import lazy_exports

if TYPE_CHECKING:
    from infer_ref.cache.contiguous import KVCache
    from infer_ref.cache.dynamic import DynamicKVCache
    from infer_ref.cache.errors import KVCacheOverflowError, PoolExhaustedError
    from infer_ref.cache.geometry import CacheGeometry
    from infer_ref.cache.paged import PagedKVCache, model_layer_windows
    from infer_ref.cache.pool import BlockPool, free_gpu_budget
    from infer_ref.cache.protocol import KVCacheProtocol
    from infer_ref.cache.snapshot import KVSnapshot
    from infer_ref.cache.static import StaticKVCache

_HOMES = {
    "KVCache": "infer_ref.cache.contiguous",
    "DynamicKVCache": "infer_ref.cache.dynamic",
    "KVCacheOverflowError": "infer_ref.cache.errors", "PoolExhaustedError": "infer_ref.cache.errors",
    "CacheGeometry": "infer_ref.cache.geometry",
    "PagedKVCache": "infer_ref.cache.paged", "model_layer_windows": "infer_ref.cache.paged",
    "BlockPool": "infer_ref.cache.pool", "free_gpu_budget": "infer_ref.cache.pool",
    "KVCacheProtocol": "infer_ref.cache.protocol",
    "KVSnapshot": "infer_ref.cache.snapshot",
    "StaticKVCache": "infer_ref.cache.static",
}  # fmt: skip
__getattr__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "BlockPool",
    "CacheGeometry",
    "DynamicKVCache",
    "KVCache",
    "KVCacheOverflowError",
    "KVCacheProtocol",
    "KVSnapshot",
    "PagedKVCache",
    "PoolExhaustedError",
    "StaticKVCache",
    "free_gpu_budget",
    "model_layer_windows",
]
