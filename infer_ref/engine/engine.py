"""Several requests over one paged pool: prefix-cached prefill, batched decode, preemption.

``Engine(model, num_blocks=...)`` owns a :class:`~infer_ref.cache.pool.BlockPool` sized for the
model (on its device, in its dtype) and a :class:`~infer_ref.engine.block_manager.BlockManager` over it.
``engine.generate(prompts, params)`` runs the requests to completion, tying three parts together:

- the :class:`~infer_ref.engine.scheduler.Scheduler` admits requests in order while the batch and
  the pool have room, makes room for each decode step and preempts when the pool runs out;
- the :class:`~infer_ref.engine.runner.ModelRunner` prefills each admitted request alone from its
  first uncached token (its first token comes from the logits of its last prompt position), then
  decodes every running request in *one* batched forward, each row at its own position with its
  own mask (``[B, 1]`` positions, ``[B, 1, S]`` masks over the longest row), and chooses tokens;
- with ``max_num_batched_tokens`` (chunked prefill, the scheduling of vLLM and SGLang), each step
  spends that many tokens: first one per running request's decode, then the rest on prompt chunks
  of the requests being prefilled, in admission order, admitting new ones while tokens are left. A
  chunk is a forward of its tokens over the positions already computed; the last chunk's last
  position gives the request's first token, and it decodes from the next step on;
- each :class:`~infer_ref.engine.sequence.Request` holds its tokens, sampling and stopping rule.

A finished request frees its blocks (its full blocks stay cached for later hits). Nothing changes
in the answer when a request is preempted and recomputed: a request's logits never depend on how
its prefix got into the cache or on what runs beside it.

Seeded sampling draws from a per-request generator (``params.make_generator()``), so a request's
tokens do not depend on its neighbours. With one request and prefix caching off the engine
reproduces :func:`infer_ref.engine.generate.generate`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from infer_ref.cache.paged import PagedKVCache, model_layer_windows
from infer_ref.cache.pool import BlockPool
from infer_ref.config import ModelConfig
from infer_ref.engine.block_manager import BlockManager, HashFn, PrefixCacheStats, block_hash
from infer_ref.engine.runner import ModelRunner, block_table_cache
from infer_ref.engine.scheduler import Scheduler, ScheduleStep
from infer_ref.engine.sequence import Request, model_eos_ids
from infer_ref.results import GenerationResult, TokenDecoder
from infer_ref.sampling import SamplingParams
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
    schedule: list[ScheduleStep] = field(default_factory=list)  # one entry per step that decoded or (chunked) ran a prompt chunk

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s else 0.0


class Engine:
    """Generation for several requests at once over one paged KV pool with prefix caching."""

    scheduler_class: type[Scheduler] = Scheduler  # a subclass may change the policy (or, planted, break it)
    cache_class: type[PagedKVCache] = PagedKVCache  # the view each forward sees (planted bugs subclass it)

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
        max_num_batched_tokens: int | None = None,
    ) -> None:
        config = getattr(model, "config", None)
        if not isinstance(config, ModelConfig):
            raise TypeError("model must have a .config attribute (a ModelConfig): the engine sizes its pool from it")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        if max_num_batched_tokens is not None and (
            isinstance(max_num_batched_tokens, bool) or not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1
        ):
            raise ValueError(f"max_num_batched_tokens must be a positive integer (tokens per step) or None (whole prefills), got {max_num_batched_tokens!r}")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.runner = ModelRunner(model)  # the model's own device and dtype
        self.device = self.runner.device
        self.pool = BlockPool.from_model_config(config, num_blocks, block_size, dtype=self.runner.dtype, device=self.device)
        self.blocks = BlockManager(self.pool, enable_prefix_caching=enable_prefix_caching, hash_fn=hash_fn)
        self._windows = model_layer_windows(config)
        if self.device.type == "cuda":
            # On CUDA a batched decode step reads K/V through the block tables in the paged decode
            # kernel (and stores through the Triton store): the fast path's attention decides that.
            from infer_ref.fast.modules import use_fast_modules

            use_fast_modules(model)
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
        scheduler = self.scheduler_class(self.blocks, self.max_batch, requests)
        while scheduler.has_work():
            if self.max_num_batched_tokens is None:
                self._whole_prefill_step(scheduler)
            else:
                self._chunked_step(scheduler, self.max_num_batched_tokens)
        self.runner.sync()
        self.stats.wall_time_s = time.perf_counter() - start
        self.stats.preemptions = scheduler.num_preemptions
        self.stats.peak_blocks_used = scheduler.peak_blocks_used
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
    ) -> Request:
        eos = model_eos_ids(self.config.eos_token_ids, self.tokenizer)
        return Request.new(index, prompt, params, self.tokenizer, eos, forced=forced, keep_logits=keep_logits, with_blocks=True)

    # -- one round: admit and prefill, then one batched decode step ------------------------------

    def _whole_prefill_step(self, scheduler: Scheduler) -> None:
        """Prefill every admissible request whole, then one decode step of the running batch."""
        self._admit(scheduler)
        batch = scheduler.schedule_decode()
        if batch:
            self.stats.schedule.append(scheduler.step())
            self._decode(batch, scheduler)

    def _chunked_step(self, scheduler: Scheduler, budget: int) -> None:
        """One step of ``budget`` tokens: its prompt chunks and decodes as :meth:`_share_budget`
        splits it, recorded in the schedule, then the batched decode."""
        batch, chunked = self._share_budget(scheduler, budget)
        if batch or chunked:
            self.stats.schedule.append(scheduler.step(batch, chunked))
        if batch:
            self._decode(batch, scheduler)

    def _share_budget(self, scheduler: Scheduler, budget: int) -> tuple[list[Request], list[Request]]:
        """The policy: the running requests' decodes first (a decode never waits behind prompt
        chunks), then prompt chunks with what is left. The batch to decode, the requests chunked."""
        batch = scheduler.schedule_decode()
        chunked, _ = self._prefill_chunks(scheduler, budget - len(batch))
        return batch, chunked

    def _admit(self, scheduler: Scheduler) -> None:
        """Prefill every request the scheduler admits now, whole: one chunk of all its uncomputed
        tokens. One whose first token ends it is done at once."""
        while (request := scheduler.next_admission()) is not None:
            assert request.seq is not None
            self._prefill_chunk(request, len(request.seq), scheduler)

    def _prefill_chunks(self, scheduler: Scheduler, budget: int) -> tuple[list[Request], int]:
        """Spend up to ``budget`` tokens on prompt chunks: the requests being prefilled, in admission
        order, then new admissions while tokens are left. The requests a chunk ran for, and the
        tokens spent."""
        chunked: list[Request] = []
        spent = 0
        for ongoing in list(scheduler.prefilling):
            if spent >= budget:
                return chunked, spent
            spent += self._prefill_chunk(ongoing, budget - spent, scheduler)
            chunked.append(ongoing)
        while spent < budget and (admitted := scheduler.next_admission()) is not None:
            scheduler.begin_prefill(admitted)
            spent += self._prefill_chunk(admitted, budget - spent, scheduler)
            chunked.append(admitted)
        return chunked, spent

    def _prefill_chunk(self, request: Request, budget: int, scheduler: Scheduler) -> int:
        """Compute up to ``budget`` of the request's uncomputed tokens (one forward over the ones
        computed or cached before); the tokens computed. When that completes its prompt (or, after a
        preemption, everything it had), its next token is chosen and it decodes from then on (or ends).
        A whole prefill is the chunk of every uncomputed token."""
        seq = request.seq
        assert seq is not None
        start = seq.num_computed_tokens
        end = min(len(seq), start + budget)
        logits = self.runner.prefill(request, seq.token_ids[start:end], block_table_cache(self.pool, [seq], self._windows, self.cache_class))
        self.stats.prefill_forwards += 1
        self.stats.prefill_tokens_computed += end - start
        self.blocks.commit(seq, end)  # before the new token joins the sequence
        if end == len(seq):
            if self.runner.take_token(request, logits):
                scheduler.finish(request)
            else:
                scheduler.start(request)
        return end - start

    def _decode(self, batch: list[Request], scheduler: Scheduler) -> None:
        """One batched forward over ``batch``; finished requests leave it."""
        seqs = [r.seq for r in batch if r.seq is not None]
        logits = self.runner.decode(batch, block_table_cache(self.pool, seqs, self._windows, self.cache_class))  # [B, V]
        self.stats.decode_steps += 1
        finished = []
        for b, request in enumerate(batch):
            self.blocks.commit(seqs[b], len(seqs[b]))  # before the new token joins the sequence
            if self.runner.take_token(request, logits[b]):
                finished.append(request)
        for request in finished:
            scheduler.finish(request)

    def _result(self, req: Request) -> EngineResult:
        base = req.collector.result(req.timing, None)
        return EngineResult(
            **vars(base),
            num_cached_tokens=req.num_cached_tokens or 0,
            num_preemptions=req.num_preemptions,
            step_logits=torch.stack(req.logits) if req.logits else None,
        )


__all__ = ["Engine", "EngineResult", "EngineStats"]
