"""The verdict on the cached-token counts an engine reported (:mod:`~infer_ref.conformance.engines.prefix_hits`),
shared by the default and the long-context workloads: recorded for the report's notes, "not judged"
when nothing ever hit or when the counts cannot be believed, failed when a request was served less
than its shared prefix warrants.

``cached_tokens`` is ``None`` where the engine does not report a count for a request and ``0``
where it reports that nothing was served (docs/adapters.md). A count on the first request after the
cache was emptied (nothing there to serve it) is a count the tier cannot believe: an engine that
reports, say, 1 for every request would otherwise be failed for shortfalls it never had.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from infer_ref.conformance.engines.prefix_hits import PrefixHit, shortfalls
from infer_ref.conformance.engines.session import EngineTier
from infer_ref.conformance.report import NOT_JUDGED


@dataclass(frozen=True)
class CountedPair:
    """A request sent on an emptied cache, then one sharing ``shared`` tokens with it: the
    cached-token counts the engine reported for each (None: not reported)."""

    shared: int
    first: int | None  # nothing could be served: anything but 0 or None is a count not to believe
    second: int | None


def judge_prefix_hits(tier: EngineTier, pairs: list[CountedPair], requests: str, computed: str) -> None:
    """``pairs``: one per request (``requests`` names them, e.g. "continued conversations") sent
    after ``computed`` ("the prompt", "the conversation") was computed on an emptied cache."""
    if not pairs:
        pytest.skip(f"{NOT_JUDGED} no {requests} could be sent and read back (the report's notes say why)")
    if unbelievable := [p.first for p in pairs if p.first]:
        pytest.skip(f"{NOT_JUDGED} cached-token counts that cannot be believed: {tier.name} reported {unbelievable[0]} "
                    f"cached tokens for a request sent first on an emptied prefix cache ({len(unbelievable)} of {len(pairs)} "
                    "such requests), where nothing could be served")  # fmt: skip
    hits = [PrefixHit(p.shared, p.second) for p in pairs if p.second is not None]
    if not hits:
        pytest.skip(f"{NOT_JUDGED} no cached-token count reported: {tier.name} answered cached_tokens None "
                    f"(not reported) for every one of {len(pairs)} {requests}")  # fmt: skip
    tier.prefix_hits += hits
    found = shortfalls(hits)
    if found is None:
        pytest.skip(f"{NOT_JUDGED} no prefix hit observed: {len(hits)} {requests} (up to "
                    f"{max((h.shared for h in hits), default=0)} shared tokens) were served nothing from cache")  # fmt: skip
    assert not found, (f"the prefix cache served less than {computed} computed just before ({len(found)} of {len(hits)} "
                       f"{requests}):\n" + "\n".join(found))  # fmt: skip


__all__ = ["CountedPair", "judge_prefix_hits"]
