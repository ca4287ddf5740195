"""Where a cache is: how many positions it holds, the checks on moving that count, and what follows.

Every cache is a storage layout (one buffer, growing tensors, blocks of a pool) holding one position
object, ``cache.position``:

- :class:`HostPosition`: a host int ``seq_len`` bounded by a capacity (contiguous and dynamic
  caches). Moving it past the capacity raises :class:`KVCacheOverflowError` and changes nothing.
- :class:`RowPositions`: the same, one length per row (a paged view's rows may hold different
  lengths); ``seq_len`` is the longest row's.
- :class:`DevicePosition`: the same host counter mirrored by an int64 ``[1]`` device tensor ``pos``,
  which is where the static caches write and what their steps read (positions, masks, lengths), so
  a captured step replays at every position. Inside :meth:`DevicePosition.host_frozen` only ``pos``
  moves; the replaying code moves the host mirror with :meth:`DevicePosition.advance_host`.

:class:`LayerWrites` records how far past the committed positions each layer has written, so an
``advance`` over positions some layer never wrote is refused (they would read back as zeros or as a
block's stale contents).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from infer_ref.cache.errors import KVCacheOverflowError
from infer_ref.step import Step


def check_count(name: str, n: int, *, allow_zero: bool = False) -> None:
    """``n`` must be a positive int (non-negative with ``allow_zero``; bools refused), else ``name`` is named."""
    low = 0 if allow_zero else 1
    if isinstance(n, bool) or not isinstance(n, int) or n < low:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} needs a {kind} integer n, got {n!r}")


def overflow_error(n: int, at: int, capacity: int) -> KVCacheOverflowError:
    """The error of ``n`` positions that do not fit after ``at`` in a capacity of ``capacity``."""
    return KVCacheOverflowError(
        f"KV cache overflow: {n} position(s) at {at} need position {at + n - 1}, but max_seq_len is {capacity}"
    )


class HostPosition:
    """Positions filled so far (``seq_len``, the RoPE offset of the next token), at most ``capacity``.

    Attributes:
        seq_len: positions held, a host int.
        capacity: positions the cache can hold (its ``max_seq_len``).
    """

    def __init__(self, capacity: int, start: int = 0) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= capacity:
            raise ValueError(f"seq_len must be an integer in [0, {capacity}], got {start!r}")
        self.capacity = capacity
        self.seq_len = start

    def fits(self, n: int) -> bool:
        """Whether ``n`` more positions fit."""
        return self.seq_len + n <= self.capacity

    def check_room(self, n: int) -> None:
        """Refuse ``n`` more positions past the capacity (naming position and capacity)."""
        if not self.fits(n):
            raise overflow_error(n, self.seq_len, self.capacity)

    def advance(self, n: int) -> None:
        """Move forward by ``n`` positions (refused, nothing changed, past the capacity)."""
        check_count("advance(n)", n)
        self.check_room(n)
        self.seq_len += n

    def set(self, n: int) -> None:
        """Hold ``n`` positions (entries at ``>= n`` become invisible, not erased)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.capacity:
            raise ValueError(f"position must be an integer in [0, {self.capacity}], got {n!r}")
        self.seq_len = n


class RowPositions(HostPosition):
    """Positions held by each row (a paged view's rows may differ); ``seq_len`` is the longest row's.

    Attributes:
        lengths: positions each row holds (host ints; ``seq_len == max(lengths)``).
    """

    def __init__(self, capacity: int, batch_size: int) -> None:
        super().__init__(capacity)
        self.lengths = [0] * batch_size

    def uniform(self) -> bool:
        """Whether every row holds the same number of positions."""
        return all(n == self.lengths[0] for n in self.lengths)

    def advance(self, n: int) -> None:
        """Every row moves forward by ``n``."""
        super().advance(n)
        self.lengths = [length + n for length in self.lengths]

    def set(self, n: int) -> None:
        """Every row holds ``n`` positions."""
        super().set(n)
        self.lengths = [n] * len(self.lengths)

    def set_rows(self, lengths: Sequence[int]) -> None:
        """Row ``b`` holds ``lengths[b]`` positions (checked by the caller against its blocks)."""
        self.lengths = list(lengths)
        self.seq_len = max(self.lengths)


class DevicePosition(HostPosition):
    """The write position on the device (``pos``, int64 ``[1]``), its host mirror ``seq_len``, and the
    step that follows from them: positions, masks over the ``num_slots`` key slots, lengths.

    Args:
        capacity: positions the cache holds.
        num_slots: key slots ``update`` returns per row (``>= capacity``: a paged layout rounds up to blocks).
        batch_size: rows (the step's lengths are ``[B]``).
        device: where ``pos`` and the step's tensors live.
        start: the initial position.
        block_tables: a paged layout's ``[B, M]`` table, carried by every step (None: contiguous).
    """

    def __init__(
        self,
        capacity: int,
        num_slots: int,
        batch_size: int,
        device: torch.device,
        *,
        start: int = 0,
        block_tables: Tensor | None = None,
    ) -> None:
        super().__init__(capacity, start)
        self.pos = torch.full((1,), start, dtype=torch.long, device=device)  # never rebound: captured graphs read it
        self.slots = torch.arange(num_slots, device=device)  # [S] key positions
        self.batch_size = batch_size
        self.block_tables = block_tables
        self.frozen = False

    # -- the step --------------------------------------------------------------------------------

    def positions(self, t: int) -> Tensor:
        """Absolute positions ``[T]`` of the ``t`` tokens about to be written (on the device)."""
        return self.pos + self.slots[:t]

    def attention_mask(self, t: int, window: int | None) -> Tensor:
        """``[T, S]`` bool: key slot ``j`` is visible to query ``i`` iff ``j <= pos+i`` (and in the window).

        Slots ``>= pos + T`` are never visible: they have not been written for this sequence.
        """
        q_pos = self.positions(t)[:, None]  # [T, 1]
        k_pos = self.slots[None, :]  # [1, S]
        visible = k_pos <= q_pos
        if window is not None:
            visible = visible & (k_pos > q_pos - window)
        return visible

    def step(self, t: int, windows: Sequence[int | None]) -> Step:
        """The forward's step, every part read from the device position (no host value in it).

        ``lengths`` (``pos + t`` per row, ``[B]``) is computed here once per forward: every layer of
        a decode step reads the same tensor, so an eager or captured step launches its two small
        kernels once, not once per layer.
        """
        return Step(
            t,
            self.positions(t),  # [T]
            tuple(windows),
            lambda window: self.attention_mask(t, window),  # [T, S]
            static_shape=True,
            lengths=(self.pos + t).expand(self.batch_size).contiguous(),  # [B]
            block_tables=self.block_tables,
        )

    # -- the two counters ------------------------------------------------------------------------

    def check_write_room(self, t: int) -> None:
        """Refuse a write of ``t`` positions past the capacity, unless host-frozen (the caller checks then)."""
        if not self.frozen:
            self.check_room(t)

    def advance(self, n: int) -> None:
        """Move the device position (and, unless frozen, the host counter) forward by ``n``."""
        check_count("advance(n)", n)
        if not self.frozen:
            super().advance(n)
        self.pos.add_(n)

    def advance_host(self, n: int) -> None:
        """Host bookkeeping for a replayed step whose captured ``advance`` already moved ``pos``."""
        check_count("advance_host(n)", n)  # host ints only: no device work per replay
        super().advance(n)

    @contextmanager
    def host_frozen(self) -> Iterator[None]:
        """Trace or capture a step without touching the host counter (the caller checks capacity)."""
        self.frozen = True
        try:
            yield
        finally:
            self.frozen = False

    def set(self, n: int) -> None:
        """Put both counters at ``n`` (entries at ``>= n`` become invisible, not erased)."""
        super().set(n)
        self.pos.fill_(n)


class LayerWrites:
    """How many positions past the committed ones each layer has written (host ints, set by the writes)."""

    def __init__(self, num_layers: int) -> None:
        self._ahead = [0] * num_layers

    def record(self, layer_idx: int, n: int) -> None:
        """Layer ``layer_idx`` wrote the ``n`` positions after the committed ones."""
        self._ahead[layer_idx] = n

    def short_of(self, n: int) -> list[int]:
        """The layers that did not write all of the next ``n`` positions."""
        return [layer for layer, ahead in enumerate(self._ahead) if ahead < n]

    def fewest(self, layers: Sequence[int]) -> int:
        """The fewest positions past the committed ones that any of ``layers`` wrote."""
        return min(self._ahead[layer] for layer in layers)

    def commit(self, n: int) -> None:
        """``n`` written positions became committed ones."""
        self._ahead = [ahead - n for ahead in self._ahead]

    def clear(self) -> None:
        """Nothing written past the committed positions (after a crop, a reset or a restore)."""
        self._ahead = [0] * len(self._ahead)


__all__ = ["DevicePosition", "HostPosition", "LayerWrites", "RowPositions", "check_count", "overflow_error"]
