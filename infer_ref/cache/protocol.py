"""What a KV cache must provide to the models and to the conformance suite.

The models only call ``seq_len``, ``update`` and ``advance``; ``generate`` and the suite also use
the capacity helpers. Any object with these members can be driven by infer_ref's models and
tested by ``infer_ref.testing``.

Static-shape caches (``StaticShapeKVCacheProtocol``) opt in to one more contract, used by the
captured decode step of ``infer_ref.engine.fast_decode``: a class attribute ``static_shape = True``
makes ``DecoderLM.forward`` take the RoPE positions from ``positions(T)`` and each layer's mask
from ``attention_mask(T, window)`` instead of building them from the host-side ``seq_len``. Such a
cache's ``update`` returns its whole buffer (``S_max`` slots), so the mask must hide every slot
that does not hold a position ``<= pos + i`` of this sequence (unwritten slots included) and, for
sliding layers, every key at distance ``>= window``. Caches without the attribute get the
contiguous behaviour: positions ``seq_len .. seq_len+T-1`` and masks ``[T, seq_len+T]``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class KVCacheProtocol(Protocol):
    @property
    def seq_len(self) -> int:
        """Positions filled so far (the RoPE offset of the next token)."""
        ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at ``[seq_len, seq_len+T)``; return K/V for ``[0, seq_len+T)``."""
        ...

    def advance(self, n: int) -> None:
        """Move ``seq_len`` forward by ``n`` once every layer has written its entries."""
        ...

    def reset(self) -> None: ...

    @property
    def is_full(self) -> bool: ...

    @property
    def remaining_capacity(self) -> int: ...


@runtime_checkable
class StaticShapeKVCacheProtocol(KVCacheProtocol, Protocol):
    """A cache whose forward shapes do not depend on the position (see the module docstring)."""

    static_shape: bool  # True

    def positions(self, t: int) -> Tensor:
        """Absolute positions ``[T]`` (int64, on the cache's device) of the ``t`` tokens being written."""
        ...

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        """``[T, S_max]`` bool, True where query ``i`` may attend key slot ``j``.

        ``j`` is visible iff it holds position ``j <= pos + i`` of this sequence and, with a
        window, ``pos + i - window < j``; unwritten slots are never visible.
        """
        ...
