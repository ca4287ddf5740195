"""The cache contract an adapter declares, and the kit's one way of driving any cache through it.

Caches differ in who moves the length and what ``update`` hands back. An adapter describes its
cache with a :class:`CacheContract` (``Adapter.cache_contract``); the conformance tests never call
``advance`` or read ``seq_len`` themselves but go through :func:`commit`, :func:`layer_length` and
:func:`written`, so one set of properties judges every style:

* **explicit advance** (infer_ref's ``KVCache``): one shared ``seq_len``; ``update`` writes at
  ``[seq_len, seq_len + T)`` of one layer and ``advance(T)`` is called once after every layer wrote.
* **advance inside update** (transformers' ``DynamicCache``/``StaticCache``, most engines' per-layer
  caches): each layer's length moves when that layer is written; there is no ``advance``.
* **what update returns**: ``"prefix"`` — exactly positions ``[0, length)``; ``"buffer"`` — a
  static buffer whose first ``length`` positions are the written ones (the rest is the attention
  mask's business).
* **sliding-window layers** (``windows=True``): a layer given a window in
  :attr:`CacheSpec.layer_windows` may keep only its last ``window`` positions (a ring buffer);
  ``read_cache`` then returns ``(K, V, positions)`` — what the layer holds and the absolute
  position of each held entry, in any order.
* **errors**: a refused call raises one of ``error_types`` *and leaves the state unchanged*; the
  state is checked first, the exception family second; message wording is reported, not required.
  ``validates=False`` declares a cache that trusts its caller: the error-case tests are then
  skipped as "does not validate" instead of failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

try:  # Unsupported is a rejected Hypothesis example inside a property
    from hypothesis.errors import UnsatisfiedAssumption as _Rejection
except ImportError:  # pragma: no cover - the kit needs hypothesis; keep the adapter importable without it
    _Rejection = Exception  # type: ignore[assignment,misc]

DEFAULT_ERROR_TYPES: tuple[type[BaseException], ...] = (ValueError, IndexError, TypeError)


class Unsupported(_Rejection):
    """Raised by an adapter for an input it deliberately does not handle (a chunk longer than its
    window, a head_dim its kernel lacks...).

    Inside a property the draw becomes a rejected example (Hypothesis draws another), so a loud
    refusal at one size never hides a silently wrong answer at another; in a fixed test the test is
    skipped as unsupported. The report counts these per test. Raise it only for inputs your engine
    refuses by design; a wrong answer must never be turned into one.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.message = reason
        UNSUPPORTED_SEEN.append(reason)

    def __str__(self) -> str:
        return self.message


UNSUPPORTED_SEEN: list[str] = []
"""Reasons of every :class:`Unsupported` raised in this process (the plugin reports them per test)."""


@dataclass(frozen=True)
class CacheContract:
    """How an adapter's cache behaves; the defaults are infer_ref's ``KVCache``."""

    advance: Literal["explicit", "in_update"] = "explicit"
    update_returns: Literal["prefix", "buffer"] = "prefix"
    windows: bool = False
    validates: bool = True
    error_types: tuple[type[BaseException], ...] = DEFAULT_ERROR_TYPES
    empty_write: Literal["raises", "ignored"] = "raises"
    length: Callable[[Any, int], int] | None = None
    """Per-layer length ``length(cache, layer)``; default ``cache.seq_len`` for every layer."""

    def describe(self) -> str:
        return (
            f"advance {self.advance}, update returns {self.update_returns}, windows {self.windows}, "
            f"validates {self.validates}, empty write {self.empty_write}"
        )


def layer_length(contract: CacheContract, cache: Any, layer: int) -> int:
    """Positions written to ``layer`` so far (its absolute length, not what a window keeps)."""
    if contract.length is not None:
        return int(contract.length(cache, layer))
    return int(cache.seq_len)


def commit(contract: CacheContract, cache: Any, n: int) -> None:
    """After every layer wrote ``n`` positions: ``advance(n)`` for explicit caches, nothing otherwise."""
    if contract.advance == "explicit":
        cache.advance(n)


def written(contract: CacheContract, kv: Tensor, length: int) -> Tensor:
    """The written part of what ``update`` returned: all of it (prefix) or its first ``length`` positions (buffer)."""
    if contract.update_returns == "buffer":
        return kv[:, :, :length]
    return kv


def state_of(contract: CacheContract, cache: Any, num_layers: int) -> list[int]:
    """Per-layer lengths: the part of the state every cache has."""
    return [layer_length(contract, cache, layer) for layer in range(num_layers)]


def as_held(read: tuple[Tensor, ...], length: int) -> tuple[Tensor, Tensor, Tensor]:
    """``read_cache``'s answer as ``(K, V, positions)``: positions ``[0, length)`` when it gave none."""
    if len(read) == 3:
        k, v, pos = read
        return k, v, torch.as_tensor(pos).to("cpu", torch.long).flatten()
    k, v = read
    return k, v, torch.arange(k.shape[2])


__all__ = [
    "DEFAULT_ERROR_TYPES",
    "CacheContract",
    "Unsupported",
    "as_held",
    "commit",
    "layer_length",
    "state_of",
    "written",
]
