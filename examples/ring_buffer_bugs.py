"""Two broken ring buffers, for showing what the conformance tests catch (``tests/kit`` runs them).

``WRAP_READS_FUTURE`` writes a step into the ring *before* attending and masks the ring as if its
slots were in position order (bottom-right causal over the slots). Until the ring wraps that is
exact, and single-token decode stays exact forever (after the write the ring holds exactly the
query's window). A multi-token step that wraps the ring, though, overwrites the oldest keys of
its first queries' windows and, slot order no longer being position order, lets those queries see
keys from later in the chunk: a bug that shipped in a popular sliding-window cache.

``REFUSES_LONG_STEPS`` is the same cache refusing steps longer than the window by raising
:class:`~infer_ref.conformance.interface.contract.Unsupported` (an engine that loudly rejects such chunks). The
kit rejects those draws, reports them as unsupported, and still judges, and catches, the
wrapping steps below the window.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from examples.ring_buffer_adapter import ADAPTER as CORRECT
from examples.ring_buffer_adapter import RingCache
from infer_ref.conformance.interface.contract import Unsupported


class WriteFirstRing(RingCache):
    """The ring is written first; ``update`` returns the ring's slots in slot order."""

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        window = self.spec.window(layer_idx)
        if window is None:
            return super().update(layer_idx, k, v)
        self._validate(layer_idx, k, v)
        start, t = self.lengths[layer_idx], k.shape[2]
        for i in range(t):  # a later token of the chunk overwrites an earlier one's slot
            self.k[layer_idx][:, :, (start + i) % window] = k[:, :, i]
            self.v[layer_idx][:, :, (start + i) % window] = v[:, :, i]
        self.lengths[layer_idx] = start + t
        filled = min(start + t, window)
        self.returned_positions[layer_idx] = torch.arange(filled)  # the bug: slots taken for positions
        return self.k[layer_idx][:, :, :filled], self.v[layer_idx][:, :, :filled]


class RefusingRing(WriteFirstRing):
    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        window = self.spec.window(layer_idx)
        if window is not None and k.shape[2] > window:
            raise Unsupported(f"a step of {k.shape[2]} tokens is longer than the window {window}")
        return super().update(layer_idx, k, v)


def attend_slot_order(q: Tensor, k: Tensor, v: Tensor, cache: RingCache, layer_idx: int, window: int | None, scale: float) -> Tensor:
    """Bottom-right causal mask over the returned slots: query ``i`` sees slots ``0 .. S - T + i``."""
    t = q.shape[2]
    keys, values = cache.update(layer_idx, k, v)
    s = keys.shape[2]
    visible = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - t, s, device=q.device)[:, None]  # [T, S]
    if window is not None:
        visible &= torch.arange(s, device=q.device)[None, :] > torch.arange(s - t, s, device=q.device)[:, None] - window
    groups = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = (q @ keys.transpose(-1, -2)) * scale  # [B, H, T, S]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ values  # [B, H, T, D]


WRAP_READS_FUTURE = replace(CORRECT, name="ring-wrap-reads-future", make_cache=WriteFirstRing, attend=attend_slot_order)
REFUSES_LONG_STEPS = replace(CORRECT, name="ring-refuses-long-steps", make_cache=RefusingRing, attend=attend_slot_order)
