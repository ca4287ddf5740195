"""The runner's optional capture: one static-shape decode step, captured once and replayed per token.

A :class:`CapturedStep` binds a model to a static cache and fixed input buffers. Each step runs
the model on the input buffer ``[B, 1]`` at the cache's device-side position, takes the argmax on
the device and writes it back into the input buffer, and appends the token (and whether the logits
could decide one) to a device-side log, so greedy decoding needs no host round trip and no kernel
outside the step per token (``readback.py`` reads the log back in chunks). On CUDA the step is
captured in a CUDA graph (optionally after ``torch.compile`` fuses its small kernels); on other
devices the same static-shape step runs eagerly, which is how the default test tier checks it.

The model code is the eager code with the fast path's modules swapped in
(:func:`infer_ref.fast.modules.use_fast_modules`): positions, masks and lengths come from the
static cache's step, a one-token step attends through the fused decode step, and the projections
take their matrix-vector kernels while the step is traced and captured. Results therefore match
the eager path up to floating-point reduction order. The step runs where the model is, in its
dtype (:func:`~infer_ref.devices.model_placement`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from infer_ref.cache.factory import DEFAULT_BLOCK_SIZE, build_cache
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.config import ModelConfig
from infer_ref.devices import check_model_device, model_placement
from infer_ref.errors import UsageError
from infer_ref.fast.modules import use_fast_modules
from infer_ref.fast.switch import decode_kernels
from infer_ref.validation import can_decide, check_token_ids

# Cache capacity is rounded up to this many slots (aligned masks keep SDPA on its fast kernels).
SLOT_ALIGN = 64
# Inductor options for compile=True. Coordinate-descent tuning of the fused kernels' launch
# parameters: Llama-1B shape on an H100, 1.62 -> 1.57 ms per step (max-autotune's Triton GEMMs: 1.66).
COMPILE_OPTIONS: dict[str, Any] = {"coordinate_descent_tuning": True}
# The greedy argmax over the vocabulary runs in two stages over this many slices: one reduction
# per slice in parallel, then one over the slice maxima (a single-row argmax under torch.compile
# is one thread block: 22 us for Llama's 128k vocabulary on an H100).
ARGMAX_SLICES = 256
# The cache layouts a captured step can use, by FastDecoder's name for them: one buffer per layer,
# or blocks of a pool read through a block table (what a paged serving engine captures).
FAST_CACHE_LAYOUTS = {"static": "static", "paged": "static-paged"}


class CapturedStep:
    """A model bound to a static cache and one decode step on fixed buffers, captured where it can be.

    Args:
        model: an infer_ref ``DecoderLM`` (anything with ``.config`` and the cache contract); the
            step runs on its device, in its dtype.
        max_seq_len: positions the cache holds (prompt + generated), rounded up to ``SLOT_ALIGN``.
        device: the model's device, or None: the step runs where the model is; a device that names
            another one is refused with a :class:`~infer_ref.errors.UsageError`.
        batch_size: rows of the input buffer ``[B, 1]``.
        cuda_graph: capture the step in a CUDA graph (default: on CUDA devices).
        compile: ``torch.compile`` the step before capturing it (CUDA only).
        compile_options: Inductor options for ``compile`` (default :data:`COMPILE_OPTIONS`).
        cache: ``"static"`` (:class:`StaticKVCache`) or ``"paged"`` (:class:`StaticPagedKVCache`).
        block_size: positions per block of the paged layout.

    ``step`` feeds ``input_ids`` (set it with ``set_input`` or leave the argmax the last step
    wrote) and returns the step's logits ``[B, 1, V]``; ``next_token`` ``[B, 1]`` holds their argmax.
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
        if cache not in FAST_CACHE_LAYOUTS:
            raise ValueError(f"cache must be one of {', '.join(FAST_CACHE_LAYOUTS)}, got {cache!r}")
        self.device, dtype = model_placement(model)
        self.use_cuda_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.use_cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got {self.device}")
        if compile and not self.use_cuda_graph:
            raise ValueError("compile=True is only supported with a CUDA graph (the compiled step is captured)")
        self.model = use_fast_modules(model)
        self.config: ModelConfig = model.config  # type: ignore[assignment]
        slots = -(-max_seq_len // SLOT_ALIGN) * SLOT_ALIGN
        self.cache: StaticKVCache | StaticPagedKVCache = build_cache(
            FAST_CACHE_LAYOUTS[cache], self.config, slots, batch_size=batch_size, dtype=dtype, device=self.device, block_size=block_size
        )
        self._allocate_buffers(batch_size)
        self.logits: Tensor | None = None
        self.compiled = compile
        self._step_fn: Callable[[], Tensor] = self._step_eager
        if compile:
            # Inductor fuses the small elementwise kernels; the CUDA graph below removes launch costs.
            options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
            self._step_fn = torch.compile(self._step_eager, fullgraph=False, options=options)
        self._graph: torch.cuda.CUDAGraph | None = None
        if self.use_cuda_graph or compile:
            self._warm_up_and_capture()

    def _allocate_buffers(self, batch_size: int) -> None:
        """The step's fixed buffers: a captured step reads and writes these addresses on every replay."""
        self.input_ids = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)  # [B, 1]
        self.next_token = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)  # [B, 1]
        self.usable = torch.ones(1, dtype=torch.bool, device=self.device)  # [1]: the last step's logits could decide
        # The step's log (see _log_step): token_log [max_seq_len, B], usable_log [max_seq_len], the
        # next entry's index on the device.
        self.token_log = torch.zeros((self.cache.max_seq_len, batch_size), dtype=torch.long, device=self.device)
        self.usable_log = torch.zeros(self.cache.max_seq_len, dtype=torch.bool, device=self.device)
        self.log_index = torch.zeros(1, dtype=torch.long, device=self.device)

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len

    # -- the step ------------------------------------------------------------------------------

    def _step_eager(self) -> Tensor:
        """One decode step on the fixed buffers: logits ``[B, 1, V]``; argmax written to the input
        and appended to the step log."""
        logits = self.model(self.input_ids, kv_cache=self.cache)  # [B, 1, V]
        token, usable = sliced_argmax(logits[:, -1, :], checked=True)
        self.next_token.copy_(token)
        self.input_ids.copy_(self.next_token)
        self.usable.copy_(usable)
        self._log_step()
        return logits

    def _log_step(self) -> None:
        """Append this step's tokens and usable flag to the device logs (a ring of ``max_seq_len``
        entries: a run between resets has at most that many steps). Part of the step: compiled,
        Inductor writes both entries in place from the argmax's own kernel (as eager ops captured
        after the step they were four more kernels)."""
        self.token_log.index_copy_(0, self.log_index, self.next_token.view(1, -1))
        self.usable_log.index_copy_(0, self.log_index, self.usable)
        self.log_index.add_(1).remainder_(self.token_log.shape[0])

    @torch.inference_mode()
    def _warm_up_and_capture(self) -> None:
        """Run the step a few times (compilation, cuBLAS workspaces), then capture it; the cache is reset after.

        The decode kernels (matrix-vector products, ``infer_ref/fast/switch.py``) are switched on
        for the traced and captured step only: replays cost no host time per kernel.
        """
        with self.cache.host_frozen(), decode_kernels():
            if self.device.type == "cuda":
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(3):
                        self._step_fn()
                torch.cuda.current_stream(self.device).wait_stream(side)
            else:
                for _ in range(2):
                    self._step_fn()
            if self.use_cuda_graph:
                self._graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._graph):
                    self.logits = self._step_fn()
        self.reset()

    # -- use -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the cache for a new sequence and restart the step log (buffers keep their addresses)."""
        self.cache.reset()
        self.log_index.zero_()

    def set_input(self, token_ids: Tensor | Sequence[int]) -> None:
        """The tokens ``[B]`` (or ``[B, 1]``) the next ``step`` feeds: ids in ``[0, vocab_size)``.

        Checked here because the captured step cannot check them (an out-of-range id inside a
        CUDA graph is a device-side assert that ends the process).
        """
        flat = token_ids.flatten() if isinstance(token_ids, Tensor) else list(token_ids)
        check_token_ids(flat, self.config.vocab_size, name="token_ids")  # before any cast: 2.7 is not 2
        if len(flat) != self.input_ids.shape[0]:
            raise UsageError(f"token_ids holds {len(flat)} ids; this decoder's batch is {self.input_ids.shape[0]}")
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(self.input_ids.shape)
        self.input_ids.copy_(ids, non_blocking=True)

    @torch.inference_mode()
    def step(self) -> Tensor:
        """Decode one position; returns logits ``[B, 1, V]`` (a graph-owned buffer when captured)."""
        if self.cache.remaining_capacity < 1:
            self.cache.advance_host(1)  # raises the overflow error, naming position and capacity
        if self._graph is not None:
            self._graph.replay()
            assert self.logits is not None
        else:
            with self.cache.host_frozen():
                self.logits = self._step_fn()
        self.cache.advance_host(1)
        return self.logits


@overload
def sliced_argmax(x: Tensor, slices: int = ..., *, checked: Literal[False] = ...) -> Tensor: ...


@overload
def sliced_argmax(x: Tensor, slices: int = ..., *, checked: Literal[True]) -> tuple[Tensor, Tensor]: ...


def sliced_argmax(x: Tensor, slices: int = ARGMAX_SLICES, *, checked: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``torch.argmax(x, -1, keepdim=True)`` for ``x`` ``[B, V]`` in two parallel stages; same result.

    Ties resolve to the first index as in ``torch.argmax``: within a slice ``max`` returns the first
    maximum, and the second stage picks the first slice that holds the overall maximum.
    ``checked=True`` also returns ``can_decide(x)`` as a ``[1]`` bool tensor, from the slice maxima
    the argmax computes anyway (``max`` propagates NaN, so their maximum is ``amax(x)``).
    """
    b, v = x.shape
    width = -(-v // slices)
    padded = F.pad(x, (0, width * slices - v), value=float("-inf"))  # [B, slices * width]
    best, index = padded.view(b, slices, width).max(dim=-1)  # [B, slices] each
    slice_idx = best.argmax(dim=-1, keepdim=True)  # [B, 1]
    token = slice_idx * width + index.gather(-1, slice_idx)  # [B, 1]
    if not checked:
        return token
    return token, can_decide(best).reshape(1)
