"""What a KV cache must provide to the models and to the conformance suite.

The models only call ``seq_len``, ``update`` and ``advance``; ``generate`` and the suite also use
the capacity helpers. Any object with these members can be driven by infer_ref's models and
tested by ``infer_ref.testing``.
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
