"""Errors the caches raise (one family, so callers can catch every capacity problem at once)."""


class KVCacheOverflowError(ValueError):
    """A write or advance past what the cache can hold (``max_seq_len``, or the blocks it can get)."""


class PoolExhaustedError(KVCacheOverflowError):
    """More blocks were asked for than the pool has free."""
