"""Several requests over one paged pool: prefix-cached prefill, batched decode, preemption.

``Engine(model, num_blocks=...)`` owns a :class:`~infer_ref.cache.pool.BlockPool` sized for the
model and a :class:`~infer_ref.cache.prefix.BlockManager` over it. ``engine.generate(prompts,
params)`` runs the requests to completion:

1. **Admission**, in order, while fewer than ``max_batch`` run and the pool can hold the next one:
   the block manager gives it a table (a prefix hit covers its first ``num_cached_tokens``
   tokens), and it is prefilled alone from its first uncached token. Its first token comes from
   the logits of its last prompt position.
2. **Decode**: every running request gets room for its newest token (a new block when its last
   one is full) and all of them run in *one* batched forward, each row at its own position with
   its own mask (``[B, 1]`` positions, ``[B, 1, S]`` masks over the longest row).
3. A finished request frees its blocks (its full blocks stay cached for later hits). When a
   running request needs a block and none is free, the most recently admitted request is
   *preempted*: its blocks are freed and it goes back to the head of the queue with every token
   it has so far, to be recomputed (through the prefix cache) when room returns. Nothing crashes
   and nothing changes in the answer: a request's logits never depend on how its prefix got into
   the cache or on what runs beside it.

Seeded sampling draws from a per-request generator (``params.make_generator()``), so a request's
tokens do not depend on its neighbours. With one request and prefix caching off the engine
reproduces :func:`infer_ref.engine.generate.generate`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from infer_ref.cache.paged import PagedKVCache, model_layer_windows
from infer_ref.cache.pool import BlockPool
from infer_ref.cache.prefix import BlockManager, HashFn, PrefixCacheStats, TokenSequence, block_hash
from infer_ref.config import ModelConfig
from infer_ref.engine.result import GenerationResult, GenerationTiming, TokenCollector, TokenDecoder
from infer_ref.engine.sampling import SamplingParams, sample_token
from infer_ref.validation import check_token_id


@dataclass
class EngineResult(GenerationResult):
    """A :class:`GenerationResult` plus what the engine adds.

    Attributes:
        num_cached_tokens: prompt tokens served by a prefix hit when the request was first admitted.
        num_preemptions: times the request was preempted and recomputed.
        step_logits: with ``keep_logits``: the logits each generated token was chosen from,
            ``[generated_tokens, V]`` (float32/float64 as the model computes them).
    """

    num_cached_tokens: int = 0
    num_preemptions: int = 0
    step_logits: Tensor | None = None


@dataclass
class EngineStats:
    """What one ``generate`` call did."""

    prefill_tokens_computed: int = 0  # tokens run through prefill forwards (recomputes included)
    prefill_forwards: int = 0
    decode_steps: int = 0  # batched decode forwards
    preemptions: int = 0
    peak_blocks_used: int = 0
    wall_time_s: float = 0.0
    generated_tokens: int = 0
    prefix: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s else 0.0


class _NoText:
    """Token ids only (no tokenizer): text is empty and stop strings are refused up front."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return ""


@dataclass(eq=False)
class _Request:
    index: int
    seq: TokenSequence
    params: SamplingParams
    collector: TokenCollector
    generator: torch.Generator | None
    forced: list[int] | None
    keep_logits: bool
    logits: list[Tensor] = field(default_factory=list)
    timing: GenerationTiming = field(default_factory=GenerationTiming)
    num_cached_tokens: int | None = None
    num_preemptions: int = 0


class Engine:
    """Generation for several requests at once over one paged KV pool with prefix caching."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenDecoder | None = None,
        *,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        max_batch: int = 8,
        hash_fn: HashFn = block_hash,
    ) -> None:
        config = getattr(model, "config", None)
        if not isinstance(config, ModelConfig):
            raise TypeError("model must have a .config attribute (a ModelConfig): the engine sizes its pool from it")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        param = next(model.parameters())
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.device = param.device
        self.pool = BlockPool.from_model_config(config, num_blocks, block_size, dtype=param.dtype, device=param.device)
        self.blocks = BlockManager(self.pool, enable_prefix_caching=enable_prefix_caching, hash_fn=hash_fn)
        self._windows = model_layer_windows(config)  # what the paged decode kernel needs on CUDA
        self.stats = EngineStats()

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def enable_prefix_caching(self) -> bool:
        return self.blocks.enable_prefix_caching

    # -- the public call -----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        forced_tokens: Sequence[Sequence[int] | None] | None = None,
        keep_logits: bool = False,
    ) -> list[EngineResult]:
        """Run every prompt to completion; results in the order of ``prompts``.

        ``forced_tokens[i]`` (teacher forcing): request ``i`` feeds these tokens instead of the ones
        it would choose (its logits are still recorded with ``keep_logits``) and stops after them.
        """
        per_request = self._check_requests(prompts, params, forced_tokens)
        requests = [self._make_request(i, p, sp, f, keep_logits) for i, (p, sp, f) in enumerate(per_request)]
        self.stats = EngineStats()
        prefix_before = PrefixCacheStats(**vars(self.blocks.stats))
        start = time.perf_counter()
        waiting: deque[_Request] = deque(requests)
        running: list[_Request] = []
        while waiting or running:
            self._admit(waiting, running)
            if running:
                self._decode_step(running, waiting)
        self._sync()
        self.stats.wall_time_s = time.perf_counter() - start
        after = self.blocks.stats
        self.stats.prefix = PrefixCacheStats(
            *(getattr(after, f) - getattr(prefix_before, f) for f in ("block_queries", "block_hits", "prompt_tokens", "cached_tokens"))
        )
        self.stats.generated_tokens = sum(len(r.collector.generated) for r in requests)
        return [self._result(r) for r in requests]

    # -- validation ----------------------------------------------------------------------------

    def _check_requests(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        forced_tokens: Sequence[Sequence[int] | None] | None,
    ) -> list[tuple[list[int], SamplingParams, list[int] | None]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError("prompts must be a non-empty list of token-id lists")
        n = len(prompts)
        plist = [params] * n if isinstance(params, SamplingParams) else list(params)
        if len(plist) != n or not all(isinstance(p, SamplingParams) for p in plist):
            raise ValueError(f"params must be one SamplingParams or a list of {n} (one per prompt), got {params!r}")
        flist = [None] * n if forced_tokens is None else list(forced_tokens)
        if len(flist) != n:
            raise ValueError(f"forced_tokens must have one entry (or None) per prompt: {n} prompts, {len(flist)} entries")
        out = []
        for i, (prompt, sp, forced) in enumerate(zip(prompts, plist, flist, strict=True)):
            for j, token in enumerate(prompt):
                check_token_id(token, name=f"prompts[{i}][{j}]")  # an integer: 2.7 is never truncated to 2
            ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError(f"prompt {i} is empty: every request needs at least one token")
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} holds token ids outside [0, {self.config.vocab_size}): {bad[:8]}")
            if sp.stop and self.tokenizer is None:
                raise ValueError(f"request {i} has stop strings but the engine has no tokenizer to decode text")
            for j, token in enumerate(forced or ()):
                check_token_id(token, name=f"forced_tokens[{i}][{j}]", vocab_size=self.config.vocab_size)
            forced_ids = None if forced is None else [int(t) for t in forced]
            if forced_ids is not None and not 1 <= len(forced_ids) <= sp.max_new_tokens:
                raise ValueError(f"forced_tokens[{i}] must hold 1..max_new_tokens ({sp.max_new_tokens}) tokens, got {len(forced_ids)}")
            self._check_fits(i, len(ids), sp.max_new_tokens)
            out.append((ids, sp, forced_ids))
        return out

    def _check_fits(self, i: int, prompt_len: int, max_new_tokens: int) -> None:
        # The last token is never fed, so a request holds at most prompt + max_new - 1 positions.
        positions = prompt_len + max_new_tokens - 1
        if prompt_len + max_new_tokens > self.config.max_position_embeddings:
            raise ValueError(
                f"request {i}: prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                f"max_position_embeddings ({self.config.max_position_embeddings})"
            )
        needed = -(-positions // self.block_size)
        if needed > self.pool.num_blocks:
            raise ValueError(
                f"request {i} may need {needed} blocks of {self.block_size} ({positions} positions) but the pool "
                f"has {self.pool.num_blocks}: it could never run; raise num_blocks"
            )

    def _make_request(
        self, index: int, prompt: list[int], params: SamplingParams, forced: list[int] | None, keep_logits: bool
    ) -> _Request:
        eos = set(self.config.eos_token_ids) | set(getattr(self.tokenizer, "eos_token_ids", ()))
        max_new = params.max_new_tokens if forced is None else len(forced)
        collector = TokenCollector(
            prompt,
            self.tokenizer or _NoText(),
            max_new_tokens=max_new,
            stop=params.stop,
            eos_ids=() if forced is not None else eos,
        )
        return _Request(index, TokenSequence(list(prompt)), params, collector, params.make_generator(), forced, keep_logits)

    # -- scheduling ----------------------------------------------------------------------------

    def _admit(self, waiting: deque[_Request], running: list[_Request]) -> None:
        while waiting and len(running) < self.max_batch:
            req = waiting[0]
            if not self.blocks.can_allocate(req.seq):
                if not running:  # everything is free and it still does not fit: _check_fits missed a case
                    raise RuntimeError(f"request {req.index} cannot be allocated in an idle pool of {self.pool.num_blocks} blocks")
                return
            waiting.popleft()
            self.blocks.allocate(req.seq)
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.seq.num_cached_tokens
            self._track_peak()
            if self._prefill(req):
                self.blocks.deallocate(req.seq)
            else:
                running.append(req)

    def _decode_step(self, running: list[_Request], waiting: deque[_Request]) -> None:
        i = 0
        while i < len(running):
            if self.blocks.can_append(running[i].seq):
                self.blocks.append(running[i].seq)
                i += 1
            else:
                self._preempt(running.pop(), waiting)  # the most recently admitted (maybe running[i] itself)
        if not running:
            return
        self._track_peak()
        rows = [r.seq for r in running]
        input_ids = torch.tensor([[s.token_ids[-1]] for s in rows], dtype=torch.long, device=self.device)  # [B, 1]
        cache = self._cache_view(rows)
        self._sync()
        t0 = time.perf_counter()
        logits = self.model(input_ids, kv_cache=cache)  # [B, 1, V]
        self._sync()
        elapsed = time.perf_counter() - t0
        self.stats.decode_steps += 1
        finished = []
        for b, req in enumerate(running):
            self.blocks.commit(req.seq, len(req.seq))
            req.timing.decode_times_s.append(elapsed)
            if self._take_token(req, logits[b, -1]):
                finished.append(req)
        for req in finished:
            running.remove(req)
            self.blocks.deallocate(req.seq)

    def _prefill(self, req: _Request) -> bool:
        """Compute the request's uncached tokens; True when its first token already finished it."""
        seq = req.seq
        start = seq.num_computed_tokens
        input_ids = torch.tensor([seq.token_ids[start:]], dtype=torch.long, device=self.device)  # [1, T]
        cache = self._cache_view([seq])
        self._sync()
        t0 = time.perf_counter()
        logits = self.model(input_ids, kv_cache=cache)  # [1, 1, V]
        self._sync()
        req.timing.prefill_time_s += time.perf_counter() - t0
        self.stats.prefill_forwards += 1
        self.stats.prefill_tokens_computed += input_ids.shape[1]
        self.blocks.commit(seq, len(seq))
        return self._take_token(req, logits[0, -1])

    def _take_token(self, req: _Request, logits: Tensor) -> bool:
        """Choose (or force) the next token from ``logits`` ``[V]``; True when the request is done."""
        step = len(req.collector.generated)
        if req.keep_logits:
            req.logits.append(logits.detach().clone())
        if req.forced is not None:
            token = req.forced[step]
        else:
            token = sample_token(logits, req.collector.tokens, req.params, req.generator)
        done = req.collector.accept(token)
        if not done:
            req.seq.token_ids.append(token)
        return done

    def _preempt(self, req: _Request, waiting: deque[_Request]) -> None:
        self.blocks.deallocate(req.seq)  # its tokens stay: readmission recomputes them (hits included)
        req.num_preemptions += 1
        self.stats.preemptions += 1
        waiting.appendleft(req)

    def _cache_view(self, rows: list[TokenSequence]) -> PagedKVCache:
        """The cache one forward sees: row ``b`` holds the computed positions of ``rows[b]`` in its
        block table (owned by the block manager) and writes the rest of its tokens after them."""
        tables = [s.block_table for s in rows]
        return PagedKVCache.over_blocks(self.pool, tables, [s.num_computed_tokens for s in rows], layer_windows=self._windows)

    def _track_peak(self) -> None:
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.pool.num_used)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _result(self, req: _Request) -> EngineResult:
        base = req.collector.result(req.timing, None)
        return EngineResult(
            **vars(base),
            num_cached_tokens=req.num_cached_tokens or 0,
            num_preemptions=req.num_preemptions,
            step_logits=torch.stack(req.logits) if req.logits else None,
        )


__all__ = ["Engine", "EngineResult", "EngineStats"]
