"""Fast decode: one static-shape decode step, captured once and replayed per token.

Prefill runs eagerly through a :class:`~infer_ref.cache.static.StaticKVCache`. Each decode step
then runs the model on a fixed input buffer ``[B, 1]`` at the cache's device-side position, takes
the argmax on the device and writes it back into the input buffer, and appends the token (and
whether the logits could decide one) to a device-side log, so greedy decoding needs no host round
trip and no kernel outside the step per token: the loop reads the log back in chunks. On CUDA the step is captured in a CUDA graph (optionally after
``torch.compile`` fuses its small kernels); on other devices the same static-shape step runs
eagerly, which is how the default test tier checks it.

The model code is the eager code with the fast path's modules swapped in
(:func:`infer_ref.fast.modules.use_fast_modules`): positions, masks and lengths come from the
static cache's step, a one-token step attends through the fused decode step, and the projections
take their matrix-vector kernels while the step is traced and captured. Results therefore match
the eager path up to floating-point reduction order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from infer_ref.cache.factory import DEFAULT_BLOCK_SIZE, build_cache
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.config import ModelConfig
from infer_ref.devices import resolve as resolve_device
from infer_ref.errors import UsageError
from infer_ref.fast.modules import use_fast_modules
from infer_ref.fast.switch import decode_kernels
from infer_ref.results import GenerationResult, GenerationTiming, TokenCollector, TokenDecoder
from infer_ref.sampling import SamplingParams, sample_token
from infer_ref.validation import can_decide, check_token_ids, logits_error

# Tokens read back to the host at a time by the greedy loop (EOS / stop strings are checked then).
READBACK_EVERY = 16
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


class FastDecoder:
    """A model bound to a static cache and a captured decode step.

    Args:
        model: an infer_ref ``DecoderLM`` (anything with ``.config`` and the cache contract).
        max_seq_len: positions the cache holds (prompt + generated), rounded up to ``SLOT_ALIGN``.
        device: where the cache lives (the model's device; default CUDA when available, else CPU).
        cuda_graph: capture the step in a CUDA graph (default: on CUDA devices).
        compile: ``torch.compile`` the step before capturing it (fuses elementwise kernels; CUDA
            only, tens of seconds to warm up).
        compile_options: Inductor options for ``compile`` (default :data:`COMPILE_OPTIONS`).
        cache: ``"static"`` (one buffer per layer, :class:`StaticKVCache`) or ``"paged"`` (blocks of a
            pool through a device block table, :class:`StaticPagedKVCache`). On CUDA both attend
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
        if cache not in FAST_CACHE_LAYOUTS:
            raise ValueError(f"cache must be one of {', '.join(FAST_CACHE_LAYOUTS)}, got {cache!r}")
        self.model = use_fast_modules(model)
        self.device = resolve_device(device)
        self.config: ModelConfig = model.config  # type: ignore[assignment]
        dtype = next(model.parameters()).dtype
        slots = -(-max_seq_len // SLOT_ALIGN) * SLOT_ALIGN
        self.cache: StaticKVCache | StaticPagedKVCache = build_cache(
            FAST_CACHE_LAYOUTS[cache], self.config, slots, batch_size=batch_size, dtype=dtype, device=self.device, block_size=block_size
        )
        self.input_ids = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)  # [B, 1]
        self.next_token = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)  # [B, 1]
        self.usable = torch.ones(1, dtype=torch.bool, device=self.device)  # [1]: the last step's logits could decide
        # The step's log (see _log_step): token_log [max_seq_len, B], usable_log [max_seq_len], the
        # next entry's index on the device.
        self.token_log = torch.zeros((self.cache.max_seq_len, batch_size), dtype=torch.long, device=self.device)
        self.usable_log = torch.zeros(self.cache.max_seq_len, dtype=torch.bool, device=self.device)
        self.log_index = torch.zeros(1, dtype=torch.long, device=self.device)
        self.logits: Tensor | None = None
        self.use_cuda_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.use_cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got {self.device}")
        if compile and not self.use_cuda_graph:
            raise ValueError("compile=True is only supported with a CUDA graph (the compiled step is captured)")
        self.compiled = compile
        self._step_fn: Callable[[], Tensor] = self._step_eager
        if compile:
            # Inductor fuses the small elementwise kernels; the CUDA graph below removes launch costs.
            options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
            self._step_fn = torch.compile(self._step_eager, fullgraph=False, options=options)
        self._graph: torch.cuda.CUDAGraph | None = None
        if self.use_cuda_graph or compile:
            self._warm_up_and_capture()

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

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor) -> Tensor:
        """Eager forward of the prompt ``[B, T]`` into the cache; logits of the last position ``[B, 1, V]``."""
        logits = self.model(input_ids.to(self.device), kv_cache=self.cache)  # [B, 1, V]
        self.next_token.copy_(torch.argmax(logits[:, -1, :], dim=-1, keepdim=True))
        self.input_ids.copy_(self.next_token)
        return logits

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


def generate_fast(
    model: nn.Module,
    tokenizer: TokenDecoder,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    device: str | torch.device,
    decoder: FastDecoder | None = None,
    on_token: Callable[[int], None] | None = None,
    eos_ids: set[int],
) -> GenerationResult:
    """``generate(..., decode="fast")``: same contract and result as the eager loop.

    Greedy decoding without a repetition penalty stays on the device (tokens are read back every
    ``READBACK_EVERY`` steps, so a few steps past an EOS or stop string may be computed and
    dropped). Other sampling settings read the logits back each step and draw with
    :func:`sample_token` and the CPU generator, exactly as the eager loop does.
    """
    device = torch.device(device)
    tokens = list(prompt_token_ids)  # checked by generate
    needed = len(tokens) + params.max_new_tokens
    if decoder is None:
        decoder = FastDecoder(model, needed, device=device)
    elif decoder.model is not model or decoder.max_seq_len < needed:
        raise ValueError(
            f"the FastDecoder passed holds {decoder.max_seq_len} positions for another or the same model; "
            f"this request needs {needed} for this model"
        )
    decoder.reset()
    collector = TokenCollector(
        tokens, tokenizer, max_new_tokens=params.max_new_tokens, stop=params.stop, eos_ids=eos_ids, on_token=on_token
    )
    accept = collector.accept
    generator = params.make_generator()
    timing = GenerationTiming()

    with torch.inference_mode():
        _sync(device)
        t0 = time.perf_counter()
        logits = decoder.prefill(torch.tensor([tokens], dtype=torch.long, device=device))  # [1, 1, V]
        first = sample_token(logits[0, -1, :], collector.tokens, params, generator, where=f"step 0 (position {len(tokens) - 1})")
        timing.prefill_time_s = time.perf_counter() - t0
        done = accept(first)
        decoder.set_input([first])

        on_device = params.greedy and params.repetition_penalty == 1.0
        if not done and on_device:
            _greedy_on_device(decoder, params.max_new_tokens - 1, accept, timing, device, len(tokens))
        elif not done:
            while not done:
                _sync(device)
                t0 = time.perf_counter()
                logits = decoder.step()
                where = f"step {len(collector.generated)} (position {len(collector.tokens) - 1})"
                token = sample_token(logits[0, -1, :], collector.tokens, params, generator, where=where)
                timing.decode_times_s.append(time.perf_counter() - t0)
                done = accept(token)
                decoder.set_input([token])

    return collector.result(timing, decoder.cache.memory_bytes)


def _greedy_on_device(
    decoder: FastDecoder,
    steps: int,
    accept: Callable[[int], bool],
    timing: GenerationTiming,
    device: torch.device,
    prompt_len: int,
) -> None:
    """Replay ``steps`` greedy steps, reading the step log back in chunks; per-step times from CUDA events.

    Each step writes its token and whether its logits could decide one (an argmax over NaN logits
    is token 0, which must never be accepted as an answer) into the decoder's device log, so a
    step is one graph replay. A chunk of ``READBACK_EVERY`` steps is copied to the host
    asynchronously and read while the next chunk runs: the device never waits on the host, at the
    price of up to two chunks computed past an EOS or stop string (dropped).
    """
    cuda = device.type == "cuda"
    batch = decoder.token_log.shape[1]
    tokens_host = torch.empty((steps, batch), dtype=torch.long, pin_memory=cuda)
    usable_host = torch.empty(steps, dtype=torch.bool, pin_memory=cuda)
    events: list[torch.cuda.Event] = []
    clocks: list[float] = []

    def mark() -> None:
        if cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        else:
            clocks.append(time.perf_counter())

    def fetch(start: int, end: int) -> torch.cuda.Event | None:
        # Steps [start, end) logged at entries [start, end): the decoder was reset before step 0.
        tokens_host[start:end].copy_(decoder.token_log[start:end], non_blocking=cuda)
        usable_host[start:end].copy_(decoder.usable_log[start:end], non_blocking=cuda)
        if not cuda:
            return None
        done = torch.cuda.Event()
        done.record()
        return done

    used = steps  # steps whose tokens were accepted (the rest ran past the end and are dropped)

    def read(start: int, end: int, done: torch.cuda.Event | None) -> bool:
        """Accept the chunk's tokens (host side); True when generation is over."""
        nonlocal used
        if done is not None:
            done.synchronize()
        _check_chunk(usable_host[start:end].tolist(), start, prompt_len)
        for offset, token in enumerate(tokens_host[start:end, 0].tolist()):
            if accept(int(token)):
                used = start + offset + 1
                return True
        return False

    pending: tuple[int, int, torch.cuda.Event | None] | None = None
    chunk_start = 0
    finished = False
    mark()
    for i in range(steps):
        decoder.step()
        mark()
        if i + 1 - chunk_start < READBACK_EVERY and i + 1 < steps:
            continue
        fetched = (chunk_start, i + 1, fetch(chunk_start, i + 1))
        chunk_start = i + 1
        if pending is not None and read(*pending):  # the previous chunk, while this one runs
            pending, finished = None, True
            break
        pending = fetched
    if pending is not None and not finished:
        read(*pending)
    if cuda:
        torch.cuda.synchronize(device)
        timing.decode_times_s.extend(a.elapsed_time(b) / 1e3 for a, b in pairwise(events[: used + 1]))
    else:
        timing.decode_times_s.extend(b - a for a, b in pairwise(clocks[: used + 1]))


def _check_chunk(usable: list[bool], first_step: int, prompt_len: int) -> None:
    """Raise for the first step of a chunk whose logits could not decide a token (named as the eager loop names it)."""
    if all(usable):
        return
    step = first_step + usable.index(False) + 1  # step 0 was the prefill's token
    raise logits_error(f"step {step} (position {prompt_len + step - 1})", "NaN, +inf or all -inf")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
