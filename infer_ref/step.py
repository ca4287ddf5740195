"""One forward's metadata, built once and handed explicitly to every layer.

``DecoderLM.forward`` asks :func:`infer_ref.cache.protocol.plan_step` for a :class:`Step` before its first layer; every block
and attention then receives it as an argument. The cache decides what the step holds (it knows
where its tokens sit); the model supplies each layer's sliding window. Nothing is looked up on the
cache by name and nothing is recognised by identity: what a layer needs to know about the forward
it runs in, the step says.

Shapes: B batch, T new tokens, S keys the cache's ``update`` returns, M blocks per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from infer_ref.masks import attention_mask

MaskFn = Callable[[int | None], Tensor | None]


@dataclass(frozen=True, eq=False)
class Step:
    """Where one forward's ``t`` tokens sit and which keys they see.

    Attributes:
        t: new tokens per row.
        positions: absolute positions of the new tokens, ``[T]`` (every row alike) or ``[B, T]``.
        windows: each layer's sliding window (None: global), as the model applies them.
        masks: the mask for a window, bool ``[T, S]`` / ``[B, T, S]`` (True: visible) over the K/V
            the cache's ``update`` returns, or None when every key is visible. Called lazily and
            at most once per distinct window (:meth:`mask`).
        static_shape: the forward's shapes do not depend on the position (a device-position cache:
            fixed buffers, CUDA-graph capture); attention backends that plan per shape plan once.
        lengths: ``[B]`` positions each row holds after this step's write, on the device (the
            length-aware decode kernels read it there); None where the cache does not give it.
        block_tables: ``[B, M]`` int32 block ids of a paged layout; None for contiguous storage.
    """

    t: int
    positions: Tensor
    windows: tuple[int | None, ...]
    masks: MaskFn
    static_shape: bool = False
    lengths: Tensor | None = None
    block_tables: Tensor | None = None
    _issued: dict[int | None, Tensor | None] = field(default_factory=dict, repr=False)

    def window(self, layer_idx: int) -> int | None:
        """Layer ``layer_idx``'s sliding window (None: it sees every earlier key)."""
        return self.windows[layer_idx]

    def mask(self, layer_idx: int) -> Tensor | None:
        """Layer ``layer_idx``'s mask (see ``masks``); layers of one window share one tensor."""
        window = self.windows[layer_idx]
        if window not in self._issued:
            self._issued[window] = self.masks(window)
        return self._issued[window]


def contiguous_step(start: int, t: int, windows: Sequence[int | None], device: torch.device | str) -> Step:
    """The step of ``t`` tokens after ``start`` positions, keys ``[0, start+t)``: causal, bottom-right aligned."""
    positions = torch.arange(start, start + t, device=device)  # [T]
    return Step(t, positions, tuple(windows), lambda window: attention_mask(t, start, window, device))


__all__ = ["MaskFn", "Step", "contiguous_step"]
