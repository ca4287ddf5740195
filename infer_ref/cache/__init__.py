"""KV caches: contiguous, static-shape, dynamic (grows by concatenation), paged (blocks
of a shared pool), and frozen snapshots of any of them.

Every cache keeps one contract (``cache/protocol.py``): ``update`` writes a layer's new K/V and
returns what the layer holds, ``advance`` commits the positions once every layer wrote. A model's
logits must not depend on which cache holds the prefix or how it got there.
"""

from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.dynamic import DynamicKVCache
from infer_ref.cache.errors import KVCacheOverflowError, PoolExhaustedError
from infer_ref.cache.geometry import CacheGeometry
from infer_ref.cache.paged import PagedKVCache, model_layer_windows
from infer_ref.cache.pool import BlockPool, free_gpu_budget
from infer_ref.cache.protocol import KVCacheProtocol
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.static import StaticKVCache

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
