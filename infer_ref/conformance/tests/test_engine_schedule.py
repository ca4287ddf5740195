"""The scheduling contract of a multi-request engine, under a KV budget small enough to preempt.

* **limits** (``engine_trace``): at every decode step at most ``max_batch`` requests run, whatever
  the mix of prompt lengths; every request runs.
* **first-come first-served through preemption** (``engine_trace``): requests first run in arrival
  order; a preempted request waits ahead of every request that never ran, and runs again before
  any of them starts.
* **decodes first under chunked prefill** (``engine_chunked_trace``): a decoding request is never
  left out of a step that spends the token budget on other requests' prompt chunks.
* **seeded tokens are the request's own** (``engine_generate``): a seeded sampled request gives
  the same tokens and logits alone (one at a time, an ample pool), in a batch that a small pool
  forces to preempt, and with the requests sent in reverse order.

The expected schedule is the rule itself, stated in the checks; the expected tokens are the
request's alone (float64: logits within 1e-9, tokens equal). Models have no EOS in their
vocabulary, so every request generates ``max_new_tokens`` and decodes at least once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ref.conformance import case_models
from infer_ref.conformance.checkpoints.snapshots import tiny_config
from infer_ref.conformance.interface.adapter import Adapter, EngineOutput, EngineSpec, EngineStep
from infer_ref.conformance.strategies import ModelCase
from infer_ref.conformance.tests.test_engine import _fewer, _run, compare_runs

BLOCK = 2
NO_EOS = 10_000  # outside the tiny vocabulary: nothing stops early
# The tiny random model's next-token distribution is peaked (at temperature 1 nearly every draw is
# the argmax, so a wrong generator would go unseen); at 4 the draws vary (checked below).
SEEDED_TEMPERATURE = 4.0


def _model(adapter: Adapter) -> Any:
    case = ModelCase("llama", {**tiny_config("llama"), "eos_token_id": [NO_EOS]}, seed=11)
    return case_models.load(adapter, case)


def blocks_needed(prompt: list[int], max_new: int) -> int:
    """Blocks of ``BLOCK`` one request can hold at its longest: prompt + max_new - 1 positions
    (the last token is never fed)."""
    return -(-(len(prompt) + max_new - 1) // BLOCK)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[list[int]], EngineSpec]:
    """2-6 prompts of 1-7 tokens, a batch limit of 1-3 and a pool of the largest request's blocks
    plus 0-4: most draws cannot hold every request at once, so decode steps preempt."""
    prompts = draw(st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=7), min_size=2, max_size=6), label="prompts")
    max_new = draw(st.integers(2, 5), label="max_new_tokens")
    pool = max(blocks_needed(p, max_new) for p in prompts) + draw(st.integers(0, 4), label="spare blocks")
    spec = EngineSpec(max_new_tokens=max_new, block_size=BLOCK, num_blocks=pool, max_batch=draw(st.integers(1, 3), label="max_batch"),
                      enable_prefix_caching=draw(st.booleans(), label="prefix caching"))  # fmt: skip
    return prompts, spec


def _trace(adapter: Adapter, model: Any, prompts: list[list[int]], spec: EngineSpec) -> list[EngineStep]:
    assert adapter.engine_trace is not None
    outputs, steps = adapter.engine_trace(model, prompts, spec)
    assert len(outputs) == len(prompts), f"{len(prompts)} prompts gave {len(outputs)} results"
    for i, r in enumerate(outputs):
        assert len(r.token_ids) == spec.max_new_tokens, f"request {i}: {len(r.token_ids)} tokens, asked {spec.max_new_tokens}"
    return steps


def check_limits(steps: list[EngineStep], num_requests: int, max_batch: int, params: dict[str, Any]) -> None:
    """Every step runs 1..max_batch distinct requests, none of them also waiting, and some step runs.

    Not every request need appear: one preempted after its second-last token is prefilled again
    with its tokens so far, and that prefill gives its last token, so it never decodes again."""
    for t, step in enumerate(steps):
        if not 1 <= len(step.running) <= max_batch:
            raise AssertionError(f"step {t} ran {len(step.running)} requests {step.running}; max_batch is {max_batch} ({params})")
        if len(set(step.running)) != len(step.running) or set(step.running) & set(step.waiting):
            raise AssertionError(f"step {t}: running {step.running}, waiting {step.waiting}: a request counted twice ({params})")
    ran = {i for step in steps for i in step.running}
    if not ran or not ran <= set(range(num_requests)):
        raise AssertionError(f"the trace ran requests {sorted(ran)} of {num_requests}: none, or ones never sent ({params})")


def check_first_come_first_served(steps: list[EngineStep], params: dict[str, Any]) -> int:
    """Requests first run in arrival order; at every step the waiting queue holds the preempted
    requests ahead of those that never ran (these in arrival order), and no new request starts
    while a preempted one waits. Returns the number of preemptions seen."""
    ran: set[int] = set()
    first_runs: list[int] = []
    preemptions = 0
    for t, step in enumerate(steps):
        new = [i for i in step.running if i not in ran]
        first_runs += new
        waiting_ran = [i for i in step.waiting if i in ran]
        preemptions += sum(1 for i in waiting_ran if t and i in steps[t - 1].running)
        fresh = [i for i in step.waiting if i not in ran]
        if step.waiting[: len(waiting_ran)] != tuple(waiting_ran):
            raise AssertionError(f"step {t}: waiting queue {step.waiting} puts requests that never ran {fresh} ahead of preempted {waiting_ran} ({params})")
        if fresh != sorted(fresh):
            raise AssertionError(f"step {t}: requests that never ran wait out of arrival order: {fresh} ({params})")
        if new and waiting_ran:
            raise AssertionError(f"step {t}: {new} started while preempted {waiting_ran} still waited ({params})")
        ran.update(step.running)
    if first_runs != sorted(first_runs):
        raise AssertionError(f"requests first ran in the order {first_runs}, not in arrival order ({params})")
    return preemptions


# A fixed workload that must preempt: four 3-token prompts generating 6 tokens each (4 blocks of 2
# at their longest) over 6 blocks, 3 at a time: the first three fill the pool at admission (2 blocks
# each) and the first decode step that crosses a block boundary has no block to spare.
FIXED_PROMPTS = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]
FIXED_SPEC = EngineSpec(max_new_tokens=6, block_size=BLOCK, num_blocks=6, max_batch=3, enable_prefix_caching=False)


@pytest.mark.ir_requires("engine.schedule")
@given(case=workloads())
@_fewer(5)
def test_running_requests_never_exceed_max_batch(ir_adapter: Adapter, case: tuple[list[list[int]], EngineSpec]) -> None:
    """Per decode step, the engine's own account of who ran: never more than ``max_batch``.

    Guards: *more sequences running than the batch limit*.
    """
    prompts, spec = case
    params = {"prompts": prompts, "spec": spec}
    steps = _trace(ir_adapter, _model(ir_adapter), prompts, spec)
    check_limits(steps, len(prompts), spec.max_batch, params)


@pytest.mark.ir_requires("engine.schedule")
@given(case=workloads())
@_fewer(5)
def test_preemption_keeps_first_come_first_served(ir_adapter: Adapter, case: tuple[list[list[int]], EngineSpec]) -> None:
    """Arrival order is kept through preemption: see :func:`check_first_come_first_served`.

    Guards: *preempted request requeued behind new arrivals*, and through the limit checks it runs
    first, *more sequences running than the batch limit*.
    """
    prompts, spec = case
    params = {"prompts": prompts, "spec": spec}
    steps = _trace(ir_adapter, _model(ir_adapter), prompts, spec)
    check_limits(steps, len(prompts), spec.max_batch, params)
    check_first_come_first_served(steps, params)


@pytest.mark.ir_requires("engine.schedule")
def test_the_fixed_workload_preempts_in_order(ir_adapter: Adapter) -> None:
    """The workload built to preempt does (so the checks above met a preemption), and in order.

    Guards: *preempted request requeued behind new arrivals*, *more sequences running than the batch limit*.
    """
    params = {"prompts": FIXED_PROMPTS, "spec": FIXED_SPEC}
    steps = _trace(ir_adapter, _model(ir_adapter), FIXED_PROMPTS, FIXED_SPEC)
    check_limits(steps, len(FIXED_PROMPTS), FIXED_SPEC.max_batch, params)
    assert check_first_come_first_served(steps, params) > 0, f"no request was preempted: {steps}"


@pytest.mark.ir_requires("engine.schedule")
def test_preemption_keeps_arrival_order_where_the_batch_limit_never_binds(ir_adapter: Adapter) -> None:
    """The fixed workload with a batch limit of all four requests: only the pool (three requests'
    blocks at admission) holds the fourth back and forces the preemption, so a batch limit read
    one too high or too low changes nothing here, and the order through the preemption is checked alone.

    Guards: *preempted request requeued behind new arrivals*.
    """
    spec = replace(FIXED_SPEC, max_batch=len(FIXED_PROMPTS))
    params = {"prompts": FIXED_PROMPTS, "spec": spec}
    steps = _trace(ir_adapter, _model(ir_adapter), FIXED_PROMPTS, spec)
    check_limits(steps, len(FIXED_PROMPTS), len(FIXED_PROMPTS), params)  # no bound: every request may run at once
    assert check_first_come_first_served(steps, params) > 0, f"no request was preempted: {steps}"


def _alone(adapter: Adapter, model: Any, prompts: list[list[int]], spec: EngineSpec) -> list[EngineOutput]:
    """Each request on its own: one at a time, an ample pool, no prefix cache."""
    ample = replace(spec, max_batch=1, enable_prefix_caching=False, num_blocks=64)
    return [_run(adapter, model, [p], replace(ample, seeds=(s,)))[0] for p, s in zip(prompts, spec.seeds, strict=True)]


def check_seeded_schedules(adapter: Adapter, model: Any, prompts: list[list[int]], spec: EngineSpec, params: dict[str, Any]) -> None:
    """Tokens and logits of every request: alone == in the preempting batch == in reverse order
    (float64: logits within 1e-9, as in ``test_engine.py``)."""
    alone = _alone(adapter, model, prompts, spec)
    compare_runs(_run(adapter, model, prompts, spec), alone, "seeded request in a preempting batch vs alone", params)
    backwards = _run(adapter, model, prompts[::-1], replace(spec, seeds=spec.seeds[::-1]))[::-1]
    compare_runs(backwards, alone, "seeded request sent in reverse order vs alone", params)


@pytest.mark.ir_requires("engine")
@given(case=workloads(), seeds=st.lists(st.integers(0, 2**31), min_size=6, max_size=6))
@_fewer(3, fraction=4)
def test_seeded_tokens_do_not_depend_on_preemption_batch_or_order(
    ir_adapter: Adapter, case: tuple[list[list[int]], EngineSpec], seeds: list[int]
) -> None:
    """Seeded sampling under drawn batch limits and small pools.

    Guards: *seeded tokens depend on preemption or the batch*.
    """
    prompts, spec = case
    spec = replace(spec, temperature=SEEDED_TEMPERATURE, seeds=tuple(seeds[: len(prompts)]), max_batch=max(2, spec.max_batch))
    check_seeded_schedules(ir_adapter, _model(ir_adapter), prompts, spec, {"prompts": prompts, "spec": spec})


@pytest.mark.ir_requires("engine")
def test_seeded_tokens_survive_the_fixed_preempting_workload(ir_adapter: Adapter) -> None:
    """The workload built to preempt (``test_the_fixed_workload_preempts_in_order``), seeded.

    Guards: *seeded tokens depend on preemption or the batch*.
    """
    spec = replace(FIXED_SPEC, temperature=SEEDED_TEMPERATURE, seeds=(101, 202, 303, 404))
    model = _model(ir_adapter)
    check_seeded_schedules(ir_adapter, model, FIXED_PROMPTS, spec, {"prompts": FIXED_PROMPTS, "spec": spec})
    sampled = [r.token_ids for r in _alone(ir_adapter, model, FIXED_PROMPTS, spec)]
    greedy = [r.token_ids for r in _alone(ir_adapter, model, FIXED_PROMPTS, replace(spec, temperature=0.0))]
    assert sampled != greedy, "the seeded draws all equal the greedy tokens: a wrong generator would go unseen"


# -- chunked prefill: decodes first ---------------------------------------------------------------


def _chunked_trace(adapter: Adapter, model: Any, prompts: list[list[int]], spec: EngineSpec, budget: int) -> list[EngineStep]:
    assert adapter.engine_chunked_trace is not None
    outputs, steps = adapter.engine_chunked_trace(model, prompts, spec, budget)
    assert len(outputs) == len(prompts), f"{len(prompts)} prompts gave {len(outputs)} results"
    for i, r in enumerate(outputs):
        assert len(r.token_ids) == spec.max_new_tokens, f"request {i}: {len(r.token_ids)} tokens, asked {spec.max_new_tokens}"
    return steps


def check_decodes_not_starved(steps: list[EngineStep], max_batch: int, params: dict[str, Any]) -> int:
    """From the step it is admitted until its last decode, a request decodes at every step, or
    waits (preempted), or is computing its prompt: never is it left out of a step that spent the
    budget on other requests' prompt chunks (its first decode included: the step after its prompt's
    last chunk). Every step decodes or prefills 1..``max_batch`` distinct requests. Returns how many
    steps ran another request's prompt chunk while one was decoding (what the check could see)."""
    for t, step in enumerate(steps):
        active = step.running + step.prefilling
        if not 1 <= len(active) <= max_batch or len(set(active)) != len(active):
            raise AssertionError(f"step {t} decoded {step.running} and prefilled {step.prefilling}: none, a request twice, or more than max_batch {max_batch} ({params})")
    seen = 0
    for i in {i for step in steps for i in step.running}:
        admitted = next(t for t, step in enumerate(steps) if i in step.running + step.prefilling)
        last_decode = max(t for t, step in enumerate(steps) if i in step.running)
        for t in range(admitted, last_decode + 1):
            step = steps[t]
            if i not in step.running + step.waiting + step.prefilling:
                raise AssertionError(
                    f"step {t}: request {i} (admitted at step {admitted}, last decode at step {last_decode}) neither decoded nor "
                    f"waited nor prefilled; the step ran prompt chunks for {step.prefilling} and decoded {step.running}: "
                    f"a decode starved behind prompt chunks ({params})"
                )  # fmt: skip
            seen += i in step.running and bool(step.prefilling)
    return seen


@st.composite
def chunked_workloads(draw: st.DrawFn) -> tuple[list[list[int]], EngineSpec, int]:
    """2-4 prompts of 1-24 tokens (long ones take several chunks), a budget of 1-8 tokens per step,
    batch limits of 1-3 and pools from tight (preempting) to ample."""
    prompts = draw(st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=24), min_size=2, max_size=4), label="prompts")
    max_new = draw(st.integers(2, 5), label="max_new_tokens")
    pool = max(blocks_needed(p, max_new) for p in prompts) + draw(st.integers(0, 16), label="spare blocks")
    spec = EngineSpec(max_new_tokens=max_new, block_size=BLOCK, num_blocks=pool, max_batch=draw(st.integers(1, 3), label="max_batch"),
                      enable_prefix_caching=draw(st.booleans(), label="prefix caching"))  # fmt: skip
    return prompts, spec, draw(st.integers(1, 8), label="max_num_batched_tokens")


# A short request that decodes while a 30-token prompt is computed 4 tokens a step: every step after
# the first runs a chunk beside its decode, so a scheduler that spends the budget on chunks first
# leaves it out.
STARVING_PROMPTS = [[5, 6, 7], list(range(20, 50))]
STARVING_SPEC = EngineSpec(max_new_tokens=6, block_size=BLOCK, num_blocks=64, max_batch=2, enable_prefix_caching=False)
STARVING_BUDGET = 4


@pytest.mark.ir_requires("engine.chunked_schedule")
@given(case=chunked_workloads())
@_fewer(3, fraction=4)
def test_decodes_are_never_starved_behind_prompt_chunks(ir_adapter: Adapter, case: tuple[list[list[int]], EngineSpec, int]) -> None:
    """Drawn chunked workloads: see :func:`check_decodes_not_starved`.

    Guards: *a decode starves behind prompt chunks*.
    """
    prompts, spec, budget = case
    params = {"prompts": prompts, "spec": spec, "max_num_batched_tokens": budget}
    check_decodes_not_starved(_chunked_trace(ir_adapter, _model(ir_adapter), prompts, spec, budget), spec.max_batch, params)


@pytest.mark.ir_requires("engine.chunked_schedule")
def test_a_decode_runs_beside_every_chunk_of_a_long_prompt(ir_adapter: Adapter) -> None:
    """The fixed workload puts a decoding request beside a long prompt's chunks (so the check met
    the case), and it decodes at every one of those steps.

    Guards: *a decode starves behind prompt chunks*.
    """
    params = {"prompts": STARVING_PROMPTS, "spec": STARVING_SPEC, "max_num_batched_tokens": STARVING_BUDGET}
    steps = _chunked_trace(ir_adapter, _model(ir_adapter), STARVING_PROMPTS, STARVING_SPEC, STARVING_BUDGET)
    assert check_decodes_not_starved(steps, STARVING_SPEC.max_batch, params) >= 4, f"no decode ran beside a prompt chunk: {steps}"
