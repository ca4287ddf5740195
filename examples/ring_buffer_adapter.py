"""Worked example: a sliding-window ring-buffer cache with per-layer lengths.

``RingCache`` keeps, for a layer with a sliding window ``w``, only ``w`` slots (position ``p``
lives in slot ``p % w``), and for a full-attention layer a plain buffer. Each layer's length moves
inside ``update`` (there is no ``advance``), the style of most engines' per-layer caches, which
the adapter declares in its :class:`~infer_ref.conformance.interface.contract.CacheContract`.

The subtle part is a multi-token step that wraps the ring: query ``i`` of the chunk needs the
``w - 1`` keys before it, some of which the chunk's own later tokens overwrite. ``update``
therefore returns the keys held *before* the write followed by the new ones (up to ``w - 1 + T``
keys) with their positions, and ``attend`` masks by position; only then is the ring overwritten.

Run the conformance tests against it (no mask function: the kit probes ``attend`` for the mask)::

    infer-ref conformance --impl examples.ring_buffer_adapter:ADAPTER     # from the repository root
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import CacheContract


class RingCache:
    """Full layers: ``[B, Hkv, max_seq_len, D]`` buffers. Window layers: ``[B, Hkv, w, D]`` rings."""

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self.max_seq_len = spec.max_seq_len
        self.lengths = [0] * spec.num_layers
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.returned_positions: list[Tensor] = [torch.empty(0, dtype=torch.long)] * spec.num_layers
        for layer in range(spec.num_layers):
            slots = spec.window(layer) or spec.max_seq_len
            shape = (spec.batch_size, spec.num_kv_heads, slots, spec.head_dim)
            self.k.append(torch.zeros(shape, dtype=spec.dtype, device=spec.device))
            self.v.append(torch.zeros(shape, dtype=spec.dtype, device=spec.device))

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``/``v`` ``[B, Hkv, T, D]`` at this layer's length; return the keys the chunk's
        queries may need, oldest first (positions in ``returned_positions[layer_idx]``)."""
        self._validate(layer_idx, k, v)
        start, t = self.lengths[layer_idx], k.shape[2]
        window = self.spec.window(layer_idx)
        if window is None:
            self.k[layer_idx][:, :, start : start + t] = k
            self.v[layer_idx][:, :, start : start + t] = v
            self.lengths[layer_idx] = start + t
            self.returned_positions[layer_idx] = torch.arange(start + t)
            return self.k[layer_idx][:, :, : start + t], self.v[layer_idx][:, :, : start + t]
        old_k, old_v, old_pos = self.held(layer_idx)
        keys, values = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        positions = torch.cat([old_pos, torch.arange(start, start + t)])
        keep = positions >= start + t - window  # the ring keeps the last `window` positions
        slots = positions[keep] % window
        self.k[layer_idx][:, :, slots.to(k.device)] = keys[:, :, keep.to(k.device)]
        self.v[layer_idx][:, :, slots.to(k.device)] = values[:, :, keep.to(k.device)]
        self.lengths[layer_idx] = start + t
        self.returned_positions[layer_idx] = positions
        return keys, values

    def held(self, layer_idx: int) -> tuple[Tensor, Tensor, Tensor]:
        """What a window layer holds, oldest first, with the absolute position of each entry."""
        length, window = self.lengths[layer_idx], self.spec.window(layer_idx)
        assert window is not None
        positions = torch.arange(max(0, length - window), length)
        slots = (positions % window).to(self.k[layer_idx].device)
        return self.k[layer_idx][:, :, slots], self.v[layer_idx][:, :, slots], positions

    def reset(self) -> None:
        self.lengths = [0] * self.spec.num_layers
        for t in (*self.k, *self.v):
            t.zero_()

    def _validate(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.spec.num_layers:
            raise IndexError(f"layer {layer_idx!r} out of range 0..{self.spec.num_layers - 1}")
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[2] == 0 or (t.shape[0], t.shape[1], t.shape[3]) != (
                self.spec.batch_size, self.spec.num_kv_heads, self.spec.head_dim
            ):  # fmt: skip
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {self.spec.entry_shape(-1)} with T >= 1")
            if t.dtype != self.spec.dtype:
                raise TypeError(f"{name} is {t.dtype}, cache holds {self.spec.dtype}")
            if t.device != torch.device(self.spec.device):
                raise ValueError(f"{name} is on {t.device}, cache is on {self.spec.device}")
        if k.shape != v.shape:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
        if self.lengths[layer_idx] + k.shape[2] > self.max_seq_len:
            raise ValueError(f"writing {k.shape[2]} at {self.lengths[layer_idx]} exceeds capacity {self.max_seq_len}")


def read_cache(cache: RingCache, layer_idx: int) -> tuple[Tensor, ...]:
    if cache.spec.window(layer_idx) is None:
        n = cache.lengths[layer_idx]
        return cache.k[layer_idx][:, :, :n], cache.v[layer_idx][:, :, :n]
    return cache.held(layer_idx)


def attend(q: Tensor, k: Tensor, v: Tensor, cache: RingCache, layer_idx: int, window: int | None, scale: float) -> Tensor:
    """softmax(q K^T * scale + mask) V, the mask built from the returned keys' positions."""
    start, t = cache.lengths[layer_idx], q.shape[2]
    keys, values = cache.update(layer_idx, k, v)
    k_pos = cache.returned_positions[layer_idx].to(q.device)[None, :]  # [1, S]
    q_pos = torch.arange(start, start + t, device=q.device)[:, None]  # [T, 1]
    visible = (k_pos <= q_pos) & ((q_pos - k_pos < window) if window is not None else True)  # [T, S]
    groups = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = (q @ keys.transpose(-1, -2)) * scale  # [B, H, T, S]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ values  # [B, H, T, D]


CONTRACT = CacheContract(advance="in_update", windows=True, length=lambda cache, layer: cache.lengths[layer])

ADAPTER = Adapter(
    name="ring-buffer-cache",
    version="1.0",
    description="examples/ring_buffer_adapter.py: per-layer lengths, ring buffers for sliding layers, mask by position",
    make_cache=RingCache,
    read_cache=read_cache,
    attend=attend,
    cache_contract=CONTRACT,
)
