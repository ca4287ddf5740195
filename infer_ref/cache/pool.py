"""The block pool behind paged caches: physical K/V blocks, reference counts and a free list.

One pool holds, for every layer, ``num_blocks`` blocks of ``block_size`` positions
(``k``/``v`` ``[L, num_blocks, block_size, Hkv, D]``). Caches borrow blocks from it, so several
caches (several requests) can share one pool, and a block can be held by more than one of them at
once (a shared prompt prefix): each block has a reference count, and it returns to the free list
when the count reaches zero.

Free-list order is part of the contract, because it decides which block a new request gets:
``acquire`` takes blocks from the head, ``release`` appends freed blocks at the tail. A block
freed long ago is therefore reused first (least recently freed first), and a block freed a moment
ago — whose contents a prefix cache may still want — is reused last. ``claim`` takes one specific
free block out of the list (reviving it) without disturbing the others' order.

Every refused call raises before changing anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from typing_extensions import Self

from infer_ref.cache.errors import PoolExhaustedError
from infer_ref.cache.geometry import CacheGeometry
from infer_ref.cache.storage import check_dims, check_storage_pair, resolve_device

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


class BlockPool:
    """Physical KV blocks shared by paged caches.

    Attributes:
        k: keys, ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``.
        v: values, same shape as ``k``.
    """

    def __init__(self, k: Tensor, v: Tensor, *, free_order: Sequence[int] | None = None) -> None:
        check_storage_pair(k, v, "[num_layers, num_blocks, block_size, num_kv_heads, head_dim]")
        self.k = k
        self.v = v
        order = list(range(k.shape[1])) if free_order is None else _check_permutation(free_order, k.shape[1])
        # An insertion-ordered dict as an ordered set: O(1) pop from the head, removal from the middle.
        self._free: dict[int, None] = dict.fromkeys(order)
        self._ref_counts = [0] * k.shape[1]

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
        free_order: Sequence[int] | None = None,
    ) -> Self:
        """A zero-filled pool (``device`` None: CUDA when available, else CPU)."""
        check_dims(
            num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, num_blocks=num_blocks, block_size=block_size
        )
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        device = resolve_device(device)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            free_order=free_order,
        )

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
        free_order: Sequence[int] | None = None,
    ) -> Self:
        """A pool sized for ``config`` (layers, kv heads, computed head_dim)."""
        return cls.allocate(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.computed_head_dim,
            num_blocks,
            block_size,
            dtype=dtype,
            device=device,
            free_order=free_order,
        )

    @classmethod
    def from_memory_budget(
        cls,
        config: ModelConfig,
        budget_bytes: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
    ) -> Self:
        """As many blocks as fit in ``budget_bytes`` (a serving engine sizes its pool from free GPU memory).

        Use ``free_gpu_budget(fraction)`` for that budget on CUDA.
        """
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be a positive integer, got {budget_bytes!r}")
        per_block = block_bytes(config, block_size, dtype)
        num_blocks = budget_bytes // per_block
        if num_blocks == 0:
            raise ValueError(
                f"a budget of {budget_bytes} bytes holds no block: one block of {block_size} positions "
                f"needs {per_block} bytes for this model in {dtype}"
            )
        return cls.from_model_config(config, num_blocks, block_size, dtype=dtype, device=device)

    # -- geometry ------------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[2]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[3]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer: ``2 * L * bs * Hkv * D * itemsize``."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.k.element_size()

    @property
    def memory_bytes(self) -> int:
        """Bytes of the whole pool (``bytes_per_block * num_blocks``)."""
        return self.k.nbytes + self.v.nbytes

    def layer(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """One layer's K and V pools, ``[num_blocks, block_size, Hkv, D]`` views."""
        return self.k[layer_idx], self.v[layer_idx]

    # -- the free list and reference counts ----------------------------------------------------

    def cache_geometry(self, batch_size: int) -> CacheGeometry:
        """The geometry of a cache of ``batch_size`` rows over this pool's blocks."""
        return CacheGeometry(self.num_layers, batch_size, self.num_kv_heads, self.head_dim, self.dtype, self.device)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order ``acquire`` hands them out."""
        return list(self._free)

    def is_free(self, block_id: int) -> bool:
        self._check_id(block_id)
        return block_id in self._free

    def ref_count(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._ref_counts[block_id]

    def acquire(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free list, each with reference count 1."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"acquire(n) needs a non-negative integer n, got {n!r}")
        if n > len(self._free):
            raise PoolExhaustedError(
                f"block pool exhausted: {n} block(s) requested, {len(self._free)} free of {self.num_blocks} "
                f"(block_size {self.block_size})"
            )
        taken = [self._pop_head() for _ in range(n)]
        for block_id in taken:
            self._ref_counts[block_id] = 1
        return taken

    def claim(self, block_id: int) -> None:
        """Take the free block ``block_id`` out of the free list (reference count 1), wherever it sits."""
        self._check_id(block_id)
        if block_id not in self._free:
            raise ValueError(f"block {block_id} is not free (reference count {self._ref_counts[block_id]}): use share()")
        del self._free[block_id]
        self._ref_counts[block_id] = 1

    def share(self, block_id: int) -> None:
        """One more holder of the used block ``block_id``."""
        self._check_id(block_id)
        if block_id in self._free:
            raise ValueError(f"block {block_id} is free: claim() it before sharing it")
        self._ref_counts[block_id] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block, in order; blocks reaching zero go to the tail of the free list.

        Refused as a whole (nothing released) if any block is free or would drop below zero,
        including a block listed more times than it is held.
        """
        ids = list(block_ids)
        for block_id in ids:
            self._check_id(block_id)
        drops: dict[int, int] = {}
        for block_id in ids:
            drops[block_id] = drops.get(block_id, 0) + 1
        over = {b: (self._ref_counts[b], n) for b, n in drops.items() if n > self._ref_counts[b]}
        if over:
            detail = ", ".join(f"block {b} held {held} time(s), released {n}" for b, (held, n) in over.items())
            raise ValueError(f"release refused (double free): {detail}")
        for block_id in ids:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None

    def __repr__(self) -> str:
        return (
            f"BlockPool(layers={self.num_layers}, blocks={self.num_blocks}x{self.block_size}, "
            f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, free={self.num_free}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    # -- helpers -------------------------------------------------------------------------------

    def _pop_head(self) -> int:
        block_id = next(iter(self._free))
        del self._free[block_id]
        return block_id

    def _check_id(self, block_id: int) -> None:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id!r} out of range: the pool has blocks 0..{self.num_blocks - 1}")


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block (K and V, every layer) for ``config``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.computed_head_dim * itemsize


def free_gpu_budget(fraction: float = 0.9, device: str | torch.device = "cuda") -> int:
    """``fraction`` of the free memory of a CUDA device, in bytes (for sizing a pool)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not torch.cuda.is_available():
        raise RuntimeError("free_gpu_budget needs a CUDA device; pass budget_bytes explicitly on CPU")
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free * fraction)


def _check_permutation(order: Sequence[int], n: int) -> list[int]:
    out = list(order)
    if sorted(out) != list(range(n)) or any(isinstance(b, bool) or not isinstance(b, int) for b in out):
        raise ValueError(f"free_order must be a permutation of 0..{n - 1}, got {out[:16]}{'...' if len(out) > 16 else ''}")
    return out
