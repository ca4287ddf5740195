"""Calling a transformers model with its KV cache by the keyword the installed transformers takes.

transformers 5.24 renamed the forward's ``past_key_values`` (and the output's) to ``cache``: the old
name still works but warns on every call (a FutureWarning, 51 of them in one conformance run, plus a
log line) and goes in 5.40. Older releases (the kit supports >= 4.56) know only ``past_key_values``.
The keyword is read from the forward's signature, so each release is called as it documents,
without hiding any warning.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["cache_keyword", "forward_with_cache"]


def cache_keyword(model: Any) -> str:
    """The name ``model``'s forward takes its KV cache by (and its output returns it by)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_with_cache(model: Any, cache: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``model(**kwargs)`` with ``cache`` passed by the keyword its forward takes: (output, the cache it returned)."""
    keyword = cache_keyword(model)
    out = model(**kwargs, **{keyword: cache})
    return out, out.get(keyword)
