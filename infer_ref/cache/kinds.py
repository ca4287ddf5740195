"""The cache types by name, without torch: what ``build_cache`` builds and the command line offers."""

from __future__ import annotations

from typing import Literal, get_args

CacheKind = Literal["contiguous", "static", "dynamic", "paged", "static-paged"]
CACHE_KINDS: tuple[str, ...] = get_args(CacheKind)
DEFAULT_BLOCK_SIZE = 16
