"""Known bugs that can be planted into infer_ref, to show that golden files catch them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor


def _no_window_on_decode() -> Callable[..., Any]:
    from infer_ref import step as common  # the mask every forward over a contiguous cache asks for

    original = common.attention_mask

    def buggy(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
        if q_len == 1:
            window = None  # the bug: decode steps forget the sliding window
        return original(q_len, start, window, device)

    return buggy


PLANTED_BUGS: dict[str, Callable[[], Callable[..., Any]]] = {
    "sliding-window-decode-mask": _no_window_on_decode,
}
"""Known bugs that can be planted into infer_ref (for showing that golden files catch them)."""


@contextlib.contextmanager
def planted_bug(name: str) -> Iterator[None]:
    """Temporarily plant a known bug into infer_ref's model code."""
    from infer_ref import step as common  # the mask every forward over a contiguous cache asks for

    if name not in PLANTED_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED_BUGS)}")
    original = common.attention_mask
    common.attention_mask = PLANTED_BUGS[name]()
    try:
        yield
    finally:
        common.attention_mask = original
