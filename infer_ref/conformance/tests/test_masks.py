"""Attention masks: for any length, offset and window, the exact set of keys each query sees.

An adapter without ``attention_mask`` is judged through its ``attend`` instead
(``infer_ref.conformance.probes``: perturb one key's value, watch which outputs move). The oracle is the definition (``infer_ref.conformance.oracles.definitions.visible_keys``): query ``i`` of a chunk
starting at ``start`` sits at ``p = start + i`` and sees key ``j`` iff ``j <= p`` and, with a
window, ``p - window < j``. Cases are drawn on and around multiples of the window.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_visibility
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.definitions import mask_as_visibility, visible_keys
from infer_ref.conformance.probes import visibility_from_attend

pytestmark = pytest.mark.ir_requires("mask")


def check(adapter: Adapter, q_len: int, start: int, window: int | None, device: str = "cpu") -> None:
    if adapter.attention_mask is None:
        got = visibility_from_attend(adapter, q_len, start, window, device)
    else:
        got = mask_as_visibility(adapter.attention_mask(q_len, start, window), q_len, start)
    assert_visibility(
        got,
        visible_keys(q_len, start, window),
        q_len=q_len,
        start=start,
        window=window,
        params={"q_len": q_len, "start": start, "window": window},
    )


@given(case=irst.mask_cases())
def test_mask_is_the_definition(ir_adapter: Adapter, ir_device: str, case: tuple[int, int, int | None]) -> None:
    """Any (q_len, start, window): the mask is exactly the definition.

    Guards every mask bug at once; the tests below pin each bug class to a focused case.
    """
    check(ir_adapter, *case, device=ir_device)


@given(window=st.integers(1, irst.MAX_WINDOW), data=st.data())
def test_decode_token_respects_the_window(ir_adapter: Adapter, ir_device: str, window: int, data: st.DataObject) -> None:
    """One new token (decode) at a position at or past the window sees exactly its last ``window`` keys.

    Guards: *sliding-window mask missing on decode* (the "a single query sees everything" shortcut).
    """
    start = data.draw(st.integers(window, 4 * window + 2), label="start")
    check(ir_adapter, 1, start, window, device=ir_device)


@given(window=st.integers(1, irst.MAX_WINDOW), data=st.data())
def test_window_holds_exactly_window_keys(ir_adapter: Adapter, ir_device: str, window: int, data: st.DataObject) -> None:
    """Every query at position ``p >= window - 1`` sees exactly ``window`` keys: distances 0..window-1.

    Guards: *window off-by-one* (``>=`` for ``>``: window + 1 keys; or window - 1).
    """
    start = data.draw(irst.positions_near_window(window), label="start")
    q_len = data.draw(st.integers(1, 2 * window + 1), label="q_len")
    check(ir_adapter, q_len, start, window, device=ir_device)


@given(start=st.integers(1, irst.MAX_SEQ), q_len=st.integers(2, 16), window=irst.windows())
def test_chunk_over_a_cache_is_bottom_right_aligned(ir_adapter: Adapter, ir_device: str, start: int, q_len: int, window: int | None) -> None:
    """A chunk of T > 1 queries after ``start`` cached positions: query i sees keys up to ``start + i``.

    Guards: *causal mask top-left aligned for T>1 over a cache* (``tril(ones(T, S))``, which hides
    the cache from the chunk's first queries).
    """
    check(ir_adapter, q_len, start, window, device=ir_device)


@pytest.mark.parametrize(
    ("q_len", "start", "window"),
    [(1, 0, None), (1, 0, 1), (1, 5, 1), (1, 4, 4), (1, 5, 4), (4, 0, 4), (5, 0, 4), (3, 4, 4), (4, 4, None), (1, 9, 3)],
)
def test_boundary_cases(ir_adapter: Adapter, ir_device: str, q_len: int, start: int, window: int | None) -> None:
    """Fixed cases on window boundaries, so every run checks them whatever Hypothesis draws."""
    check(ir_adapter, q_len, start, window, device=ir_device)
