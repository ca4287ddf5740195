"""KV caches. ``KVCache`` is the contiguous pre-allocated cache of seed 000."""

from infer_ref.cache.contiguous import KVCache, KVCacheOverflowError
from infer_ref.cache.protocol import KVCacheProtocol

__all__ = ["KVCache", "KVCacheOverflowError", "KVCacheProtocol"]
