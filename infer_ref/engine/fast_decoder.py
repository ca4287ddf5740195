"""``FastDecoder``: the runner's captured step as an object of its own, for callers that drive it.

``generate(..., decode="fast")`` builds a captured step for one request; a :class:`FastDecoder`
keeps one across requests (``generate(..., decode=decoder)``) or is stepped by hand (benchmarks,
teacher forcing): ``reset()``, ``prefill(ids)``, then ``set_input`` / ``step`` per token. The step
itself (buffers, warm-up, CUDA graph, compile, step log) is :class:`~infer_ref.engine.capture.CapturedStep`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from infer_ref.cache.factory import DEFAULT_BLOCK_SIZE
from infer_ref.devices import check_model_device
from infer_ref.engine.capture import CapturedStep


class FastDecoder(CapturedStep):
    """A model bound to a static cache and a captured decode step.

    Args:
        model: an infer_ref ``DecoderLM`` (anything with ``.config`` and the cache contract).
        max_seq_len: positions the cache holds (prompt + generated), rounded up to ``SLOT_ALIGN``.
        device: the model's device, or None: the decoder runs where the model is, in its dtype; a
            device that names another one is refused with a :class:`~infer_ref.errors.UsageError`.
        cuda_graph: capture the step in a CUDA graph (default: on CUDA devices).
        compile: ``torch.compile`` the step before capturing it (fuses elementwise kernels; CUDA
            only, tens of seconds to warm up).
        compile_options: Inductor options for ``compile`` (default ``COMPILE_OPTIONS``).
        cache: ``"static"`` (one buffer per layer, ``StaticKVCache``) or ``"paged"`` (blocks of a
            pool through a device block table, ``StaticPagedKVCache``). On CUDA both attend
            through the length-aware decode kernel, which reads only the valid prefix.
        block_size: positions per block of the paged layout.

    Use: ``reset()``, ``prefill(ids)`` (logits ``[B, 1, V]``), then ``step()`` per token. ``step``
    feeds ``input_ids`` (set it with ``set_input`` or leave the argmax the last step wrote) and
    returns the step's logits ``[B, 1, V]``; ``next_token`` ``[B, 1]`` holds their argmax.
    """

    def __init__(
        self,
        model: nn.Module,
        max_seq_len: int,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 1,
        cuda_graph: bool | None = None,
        compile: bool = False,
        compile_options: Mapping[str, Any] | None = None,
        cache: str = "static",
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        check_model_device(model, device)  # before the modules are swapped or anything is allocated
        super().__init__(
            model, max_seq_len, batch_size=batch_size, cuda_graph=cuda_graph, compile=compile,
            compile_options=compile_options, cache=cache, block_size=block_size,
        )  # fmt: skip

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor) -> Tensor:
        """Eager forward of the prompt ``[B, T]`` into the cache; logits of the last position ``[B, 1, V]``."""
        logits = self.model(input_ids.to(self.device), kv_cache=self.cache)  # [B, 1, V]
        self.next_token.copy_(torch.argmax(logits[:, -1, :], dim=-1, keepdim=True))
        self.input_ids.copy_(self.next_token)
        return logits
