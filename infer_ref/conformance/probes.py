"""Finding out from ``attend`` itself which keys each query sees.

An implementation without a separate mask function still has a mask: it is whatever its attention
step does. Softmax gives every visible key a positive weight, so adding 1 to the value of key
``j`` changes output row ``i`` exactly when query ``i`` sees key ``j``. One run per key, in
float64 on tiny shapes, recovers the full visibility table for the mask properties.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.conformance.interface.adapter import Adapter, CacheSpec
from infer_ref.conformance.interface.contract import commit

HEAD_DIM = 4


def _run(adapter: Adapter, q: Tensor, k: Tensor, v: Tensor, start: int, window: int | None, device: str) -> Tensor:
    """Write ``start`` positions in chunks no longer than the window, then attend the rest; return
    the last chunk's output ``[T, D]``."""
    assert adapter.make_cache is not None and adapter.attend is not None
    total = q.shape[2]
    cache = adapter.make_cache(CacheSpec(1, 1, 1, HEAD_DIM, total, torch.float64, device, (window,)))
    scale = HEAD_DIM**-0.5
    step = window or max(start, 1)
    for a in range(0, start, step):
        b = min(start, a + step)
        adapter.attend(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], cache, 0, window, scale)
        commit(adapter.cache_contract, cache, b - a)
    out = adapter.attend(q[:, :, start:], k[:, :, start:], v[:, :, start:], cache, 0, window, scale)
    return out[0, 0].detach().to("cpu")


def visibility_from_attend(adapter: Adapter, q_len: int, start: int, window: int | None, device: str = "cpu") -> Tensor:
    """Bool ``[q_len, start + q_len]``: True where perturbing key ``j``'s value changes query ``i``'s output."""
    total = start + q_len
    g = torch.Generator().manual_seed(7919 * total + q_len)
    q, k, v = (0.5 * torch.randn(1, 1, total, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))
    q, k, v = q.to(device), k.to(device), v.to(device)
    base = _run(adapter, q, k, v, start, window, device)
    seen = torch.zeros(q_len, total, dtype=torch.bool)
    for j in range(total):
        bumped = v.clone()
        bumped[:, :, j] += 1.0
        seen[:, j] = (_run(adapter, q, k, bumped, start, window, device) != base).any(dim=-1)
    return seen
