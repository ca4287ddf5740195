"""The verdict on the cached-token counts an engine reported (:mod:`~infer_ref.conformance.engines.verdicts.prefix_hits`),
shared by the default and the long-context workloads: recorded for the report's notes, "not judged"
when nothing ever hit, failed when a request was served less than its shared prefix warrants.
"""

from __future__ import annotations

import pytest

from infer_ref.conformance.engines.session import EngineTier
from infer_ref.conformance.engines.verdicts.prefix_hits import PrefixHit, shortfalls
from infer_ref.conformance.report import NOT_JUDGED


def judge_prefix_hits(tier: EngineTier, hits: list[PrefixHit], requests: str, computed: str) -> None:
    """``hits``: one per request (``requests`` names them, e.g. "continued conversations") sent
    after ``computed`` ("the prompt", "the conversation") was computed on an emptied cache."""
    tier.prefix_hits += hits
    found = shortfalls(hits)
    if found is None:
        pytest.skip(f"{NOT_JUDGED} no prefix hit observed: {len(hits)} {requests} (up to "
                    f"{max((h.shared for h in hits), default=0)} shared tokens) were served nothing from cache")  # fmt: skip
    assert not found, (f"the prefix cache served less than {computed} computed just before ({len(found)} of {len(hits)} "
                       f"{requests}):\n" + "\n".join(found))  # fmt: skip


__all__ = ["judge_prefix_hits"]
