"""The wording of the engine tier's notes in the report (one place, whichever process writes them)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence


def spread_note(what: str, largest: float, where: str, comparisons: int, tolerance: float, source: str) -> str:
    """``largest difference from the oracle: 2.1e-05 nats (test[ckpt], 286 answers); tolerance ...``."""
    at = f"{where}, " if where else ""  # every difference 0: no test to name
    judged = f"tolerance {tolerance:.3g} ({source})" if tolerance != float("inf") else source
    return f"largest difference {what}: {largest:.3g} nats ({at}{comparisons} answers); {judged}"


def left_out_note(name: str, reasons: Sequence[str], requests: int) -> str:
    """One note: how many requests were left out as unreadable, of how many, and why (each reason
    counted, with its server address and folder elided)."""
    kinds = Counter(re.sub(r"\S*/\S*", "…", why) for why in reasons)
    listed = "; ".join(f"{count}× {why[:160]}" for why, count in kinds.most_common(4))
    return f"requests left out because {name}'s answer cannot be read back as token ids: {len(reasons)} of {requests} ({listed})"


def not_continued_note(reasons: Sequence[str]) -> str:
    """One note: the conversations not continued (so not judged) because their history cannot be sent as text."""
    listed = "; ".join(reasons[:4]) + ("; …" if len(reasons) > 4 else "")
    return f"conversations not continued, so not judged, because their history cannot be sent as text: {len(reasons)} ({listed})"
