"""``FastDecoder``: the runner's captured step as an object of its own, for callers that drive it.

``generate(..., decode="fast")`` builds a captured step for one request; a :class:`FastDecoder`
keeps one across requests (``generate(..., decode=decoder)``) or is stepped by hand (benchmarks,
teacher forcing): ``reset()``, ``prefill(ids)``, then ``set_input`` / ``step`` per token. The step
itself (buffers, warm-up, CUDA graph, compile, step log) is :class:`~infer_ref.engine.capture.CapturedStep`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer_ref.engine.capture import CapturedStep


class FastDecoder(CapturedStep):
    """A model bound to a static cache and a captured decode step, with an eager prefill.

    Takes :class:`~infer_ref.engine.capture.CapturedStep`'s arguments. On CUDA both cache layouts
    (``"static"``, ``"paged"``) attend through the length-aware decode kernel, which reads only the
    valid prefix; ``compile=True`` fuses elementwise kernels (CUDA only, tens of seconds to warm up).

    Use: ``reset()``, ``prefill(ids)`` (logits ``[B, 1, V]``), then ``step()`` per token. ``step``
    feeds ``input_ids`` (set it with ``set_input`` or leave the argmax the last step wrote) and
    returns the step's logits ``[B, 1, V]``; ``next_token`` ``[B, 1]`` holds their argmax.
    """

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor) -> Tensor:
        """Eager forward of the prompt ``[B, T]`` into the cache; logits of the last position ``[B, 1, V]``."""
        logits = self.model(input_ids.to(self.device), kv_cache=self.cache)  # [B, 1, V]
        self.next_token.copy_(torch.argmax(logits[:, -1, :], dim=-1, keepdim=True))
        self.input_ids.copy_(self.next_token)
        return logits
