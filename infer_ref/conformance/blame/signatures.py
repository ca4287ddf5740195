"""Which bug class can fail which probe: the table the blame is read from.

For each class of docs/design.md that a model-level run can show, ``always`` lists the probes that
*every* bug of the class fails (on the probe checkpoints, which are built so that it shows), and
``never`` the probes that *no* bug of the class can fail; the rest are "maybe" (a bug of the class
may or may not show there: a cached run judged against the implementation's own uncached forward
misses a bug both paths share). Each entry follows from what the probe computes:

- *one position*: a single token at position 0 attends to itself only (weight 1) and is rotated by
  angle 0, so no attention, RoPE, mask or cache bug can move it;
- *repeated token*: every layer averages identical value vectors, so only values that depend on the
  position (V rotated) or, through a cache, entries that are not this layer's own keys and values
  (unwritten slots, another layer's slice, a gap left by a double advance) can make positions differ;
- a *variant* with one feature neutralised (no window, every layer sliding, scalar = head_dim, no
  llama3 scaling, unit QK-norm gains, one layer) is passed by a bug of that feature and by no other;
- *cache length* reads the cache's counter after prefill and decode steps: only an advance bug moves it;
- *decode* prefills two tokens from position 0, so a causal mask misaligned for T > 1 over a cache
  can only show there through a sliding window; *chunks* feed T = 3 over the cache.

A class that needs a sliding window cannot fail a probe whose sequence crosses none, and a class
that concerns a feature the family lacks (llama3 scaling outside Llama) cannot fail any probe of
that family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from infer_ref.conformance.mutants import BUG_CLASSES

Sign = Literal["always", "never", "maybe"]

ONE, REP, REP_CACHED, FULL = "one position", "repeated token", "repeated token, cached", "full forward"
FULL_NO_WINDOW, FULL_ALL_SLIDING = "full forward, window off", "full forward, every layer sliding"
FULL_UNIT_QK, FULL_SCALAR, FULL_NO_LLAMA3 = "full forward, unit QK-norm", "full forward, scalar = head_dim", "full forward, no llama3 scaling"
Q_NORM_IGNORED, CACHE_LENGTH = "q-norm ignored", "cache length"
DECODE, CHUNKS, DECODE_NO_WINDOW, CHUNKS_NO_WINDOW = "decode", "chunks", "decode, window off", "chunks, window off"
DECODE_ONE_LAYER, CHUNKS_ONE_LAYER = "decode, one layer", "chunks, one layer"

FULL_VARIANTS = frozenset({FULL_NO_WINDOW, FULL_ALL_SLIDING, FULL_UNIT_QK, FULL_SCALAR, FULL_NO_LLAMA3})
CACHED = frozenset({DECODE, CHUNKS, DECODE_NO_WINDOW, CHUNKS_NO_WINDOW, DECODE_ONE_LAYER, CHUNKS_ONE_LAYER})
UNCACHED = frozenset({ONE, REP, FULL, Q_NORM_IGNORED}) | FULL_VARIANTS
ALL = UNCACHED | CACHED | {REP_CACHED, CACHE_LENGTH}


def _every(family: str) -> bool:
    return True


@dataclass(frozen=True)
class Signature:
    always: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    applies: Callable[[str], bool] = _every  # the family has the feature the class concerns
    feature: str = ""  # that feature, for the report ("sliding windows")
    needs_window: bool = False  # never fails a probe whose sequence crosses no sliding window
    decode_needs_window: bool = False  # T = 1 steps show it only through a window (the T > 1 mask class)
    notes: tuple[str, ...] = field(default=())

    def sign(self, probe: str, family: str, windowed: bool) -> Sign:
        if not self.applies(family) or (self.needs_window and not windowed):
            return "never"
        if self.decode_needs_window and not windowed and probe in (DECODE, DECODE_NO_WINDOW, DECODE_ONE_LAYER):
            return "never"
        if probe in self.always:
            return "always"
        if probe == CACHE_LENGTH:  # it reads the cache's counter, which only an advance bug moves
            return "never"
        return "never" if probe in self.never else "maybe"


def _gemma(family: str) -> bool:
    return family == "gemma3_text"


def _qk_norm(family: str) -> bool:
    return family in ("qwen3", "gemma3_text")


def _llama(family: str) -> bool:
    return family == "llama"


(ROPE_OFFSET, DECODE_WINDOW, OFF_BY_ONE, ONE_WINDOW, GLOBAL_LENGTH, TOP_LEFT, UNWRITTEN, NOT_RESET, ADVANCE,
 V_ROTATED, QK_NORM, SCALE, EMBED_SCALE, LLAMA3, ALIASING, OVERFLOW) = BUG_CLASSES  # fmt: skip

SIGNATURES: dict[str, Signature] = {
    ROPE_OFFSET: Signature(always=CACHED, never=UNCACHED | {REP_CACHED, CACHE_LENGTH}),
    DECODE_WINDOW: Signature(
        always=frozenset({DECODE, DECODE_ONE_LAYER}), never=UNCACHED | {REP_CACHED, CHUNKS, CHUNKS_ONE_LAYER}, needs_window=True, applies=_gemma, feature="sliding windows"
    ),
    OFF_BY_ONE: Signature(
        always=frozenset({FULL, FULL_ALL_SLIDING, FULL_UNIT_QK, FULL_SCALAR}), never=frozenset({ONE, REP, REP_CACHED, Q_NORM_IGNORED}),
        applies=_gemma, needs_window=True, feature="sliding windows",
    ),
    ONE_WINDOW: Signature(
        always=frozenset({FULL, FULL_UNIT_QK, FULL_SCALAR}),
        never=frozenset({ONE, REP, REP_CACHED, Q_NORM_IGNORED, FULL_ALL_SLIDING, DECODE_ONE_LAYER, CHUNKS_ONE_LAYER}),
        applies=_gemma, needs_window=True, feature="sliding windows",
    ),
    GLOBAL_LENGTH: Signature(
        always=frozenset({DECODE, CHUNKS, DECODE_ONE_LAYER, CHUNKS_ONE_LAYER}), never=UNCACHED | {REP_CACHED}, applies=_gemma,
        needs_window=True, feature="sliding windows",
    ),
    TOP_LEFT: Signature(
        always=frozenset({CHUNKS, CHUNKS_NO_WINDOW, CHUNKS_ONE_LAYER}), never=UNCACHED | {REP_CACHED}, decode_needs_window=True
    ),
    UNWRITTEN: Signature(always=CACHED | {REP_CACHED}, never=UNCACHED),
    NOT_RESET: Signature(never=ALL),  # every probe runs on a fresh cache
    ADVANCE: Signature(always=frozenset({DECODE, DECODE_NO_WINDOW, DECODE_ONE_LAYER, CACHE_LENGTH}), never=UNCACHED),
    V_ROTATED: Signature(always=frozenset({REP, REP_CACHED, FULL}) | FULL_VARIANTS, never=frozenset({ONE, Q_NORM_IGNORED})),
    QK_NORM: Signature(
        always=frozenset({FULL, FULL_NO_WINDOW, FULL_ALL_SLIDING, FULL_SCALAR}), never=frozenset({ONE, REP, REP_CACHED}), applies=_qk_norm,
        feature="QK-norm",
    ),
    SCALE: Signature(
        always=frozenset({FULL, FULL_NO_WINDOW, FULL_ALL_SLIDING, FULL_UNIT_QK}),
        never=frozenset({ONE, REP, REP_CACHED, FULL_SCALAR, Q_NORM_IGNORED}),
        applies=_gemma, feature="query_pre_attn_scalar",
    ),
    # A rounding to bfloat16 that float64 probes cannot see: the planted bug moves them by 0.
    EMBED_SCALE: Signature(never=ALL, applies=_gemma, feature="a scaled embedding"),
    LLAMA3: Signature(always=frozenset({FULL}), never=frozenset({ONE, REP, REP_CACHED, FULL_NO_LLAMA3, Q_NORM_IGNORED}), applies=_llama,
                      feature="llama3 RoPE scaling"),
    ALIASING: Signature(
        always=frozenset({REP_CACHED, DECODE, CHUNKS, DECODE_NO_WINDOW, CHUNKS_NO_WINDOW}),
        never=UNCACHED | {DECODE_ONE_LAYER, CHUNKS_ONE_LAYER},
    ),
    OVERFLOW: Signature(never=ALL),  # the probes' caches have room to spare
}

# Classes no probe can see (low precision, float64 probes cannot show it) that still concern one
# family's feature: a failed test case of another family cannot be theirs.
FAMILY_ONLY: dict[str, tuple[Callable[[str], bool], str]] = {
    "Gemma's 1 + w formed in low precision": (_gemma, "Gemma's 1 + w norm"),
}


def family_feature(cls: str) -> tuple[Callable[[str], bool], str] | None:
    """(the families that have the feature ``cls`` concerns, that feature), or None when every family has it."""
    if cls in FAMILY_ONLY:
        return FAMILY_ONLY[cls]
    signature = SIGNATURES.get(cls)
    if signature is None or signature.applies is _every:
        return None
    return signature.applies, signature.feature

