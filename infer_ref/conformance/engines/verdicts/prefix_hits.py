"""Whether a prefix cache hits where it should, from the cached-token counts an engine reports.

A prefix cache whose lookup silently stops early (it never matches past the first block, say)
leaves every answer right: only the counts show it. The tier sends a prompt, then the same prompt
extended by a few tokens, and reads how many prompt tokens the engine says it served from cache.

The engine's block size is not known (an engine may ignore the size the tier asks for), so it is
inferred from the counts themselves: the greatest common divisor ``g`` of the nonzero counts (a
paged cache hits whole blocks; a token-level cache such as llama.cpp's gives ``g = 1``). A request
sharing ``shared`` tokens with one computed before should then be served at least
``((shared - 1) // g) * g`` of them: every whole block of the shared prefix, less one block of slack
for an engine that publishes a block only once a token past it is written. With no hit at all the
cache is not judged (an engine whose blocks are longer than every shared prefix hits nothing, and
is not wrong); a shortfall is only ever claimed against the granularity the engine itself shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import gcd

from infer_ref.conformance.engines.ledger import PrefixHit


@dataclass(frozen=True)
class CountedPair:
    """A request sent on an emptied cache, then one sharing ``shared`` tokens with it: the
    cached-token counts the engine reported for each (None: not reported)."""

    shared: int
    first: int | None  # nothing could be served: anything but 0 or None is a count not to believe
    second: int | None


def granularity(hits: Sequence[PrefixHit]) -> int | None:
    """The engine's hit granularity: the gcd of the nonzero counts (None: nothing ever hit)."""
    nonzero = [h.cached for h in hits if h.cached > 0]
    return gcd(*nonzero) if nonzero else None


def expected_hit(shared: int, block: int) -> int:
    """The least a cache of ``block``-token granularity should serve of ``shared`` shared tokens."""
    return ((shared - 1) // block) * block if shared > 0 else 0


def shortfalls(hits: Sequence[PrefixHit]) -> list[str] | None:
    """The requests served less than their shared prefix warrants, described; None when nothing hit
    (the cache cannot be judged), [] when every request was served what it should be."""
    block = granularity(hits)
    if block is None:
        return None
    return [
        f"request {i}: {h.cached} of {h.shared} shared prompt tokens served from cache, at least "
        f"{expected_hit(h.shared, block)} expected (hits come in multiples of {block})"
        for i, h in enumerate(hits)
        if h.cached < expected_hit(h.shared, block)
    ]


def summary(hits: Sequence[PrefixHit]) -> str:
    """The report's note: how often and how much the prefix cache hit."""
    served = sum(h.cached for h in hits)
    shared = sum(h.shared for h in hits)
    hit = sum(h.cached > 0 for h in hits)
    block = granularity(hits)
    granule = f", in multiples of {block} tokens" if block else ""
    return (
        f"prefix cache hits observed: {hit} of {len(hits)} extending requests hit, "
        f"{served} of {shared} shared prompt tokens served from cache{granule}"
    )
