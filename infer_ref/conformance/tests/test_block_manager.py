"""Block-manager capability: a Hypothesis state machine drives the allocator under test beside
:class:`~infer_ref.conformance.oracles.allocator.PoolModel` (the specification in plain Python) and a fake K/V
memory.

Rules: add a request (new, sharing a prefix with an earlier one, or a preempted one readmitted),
prefill a chunk, decode a token, finish, preempt, reset the prefix cache. Tiny pools, block sizes
1-4 and a two-token vocabulary, so prefixes repeat and pools run out. After every rule:

* the allocator's block tables, hits, free list (in order), reference counts and hash map equal the
  model's: every block id handed out is predicted;
* free + used == total, no block twice in the free list, ref count == number of live tables holding
  the block, 0 exactly when free, and ``len(table) == ceil(len / bs)``;
* the fake memory holds, at every computed position of every live request, the K/V of that
  request's own prefix: each write records ``tokens[:pos+1]`` in its slot, so a wrong hit, a block
  taken while still cached by its owner, or a hash published before its block was written shows
  up as the wrong prefix (or none) in a slot;
* a refused call changes nothing; a hit never covers the last prompt token; all blocks are free
  once every request finished.

Run twice: with the xxh64 chain, and with every hash forced equal (token verification alone keeps
hits correct).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.allocator import PoolModel, collide_all, snapshot
from infer_ref.engine.block_manager import HashFn, block_hash

pytestmark = pytest.mark.ir_requires("block_manager")

VOCAB = st.integers(0, 1)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self, adapter: Adapter, hash_fn: HashFn) -> None:
        super().__init__()
        self.adapter = adapter
        self.hash_fn = hash_fn
        self.alloc: Any = None
        self.model: PoolModel | None = None
        self.next_id = 0
        self.live: dict[int, list[int]] = {}  # seq id -> tokens
        self.computed: dict[int, int] = {}  # seq id -> positions whose K/V are written
        self.preempted: list[list[int]] = []
        self.prompts: list[list[int]] = []
        self.memory: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, offset) -> prefix written there
        self.hits_seen = 0

    @initialize(num_blocks=st.integers(3, 10), block_size=st.integers(1, 4))
    def setup(self, num_blocks: int, block_size: int) -> None:
        assert self.adapter.make_block_manager is not None
        self.alloc = self.adapter.make_block_manager(num_blocks, block_size, self.hash_fn)
        self.model = PoolModel(num_blocks, block_size, self.hash_fn)
        self.bs = block_size

    # -- helpers -------------------------------------------------------------------------------

    def _write(self, seq_id: int, start: int, end: int) -> None:
        """What a forward does: K/V of positions [start, end) into the slots of the table."""
        tokens, table = self.live[seq_id], self.model_table(seq_id)
        for pos in range(start, end):
            block = table[pos // self.bs]
            assert self.alloc.ref_count(block) == 1, (
                f"request {seq_id} writes position {pos} into block {block}, which "
                f"{self.alloc.ref_count(block)} requests hold: a shared block must never be written"
            )
            self.memory[(block, pos % self.bs)] = tuple(tokens[: pos + 1])

    def model_table(self, seq_id: int) -> list[int]:
        assert self.model is not None
        return self.model.table(seq_id)

    def _admit(self, tokens: list[int]) -> None:
        assert self.model is not None
        seq_id, self.next_id = self.next_id, self.next_id + 1
        before = snapshot(self.alloc)
        predicted = self.model.allocate(seq_id, tokens)
        if predicted is None:
            with pytest.raises(Exception):  # noqa: B017 - any refusal, as long as nothing changed
                self.alloc.allocate(seq_id, tokens)
            assert snapshot(self.alloc) == before, "a refused allocation changed the pool or the hash map"
            return
        table, cached = self.alloc.allocate(seq_id, list(tokens))
        assert (table, cached) == predicted, f"allocate({tokens}) gave table {table} cached {cached}, spec says {predicted}"
        assert cached <= len(tokens) - 1, f"a hit of {cached} tokens covers the whole {len(tokens)}-token prompt"
        self.hits_seen += cached > 0
        self.live[seq_id] = list(tokens)
        self.computed[seq_id] = cached

    # -- rules ---------------------------------------------------------------------------------

    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        if self.preempted and data.draw(st.booleans(), label="readmit"):  # type: ignore[arg-type]
            self._admit(self.preempted.pop(data.draw(st.integers(0, len(self.preempted) - 1))))
            return
        prefix: list[int] = []
        if self.prompts and data.draw(st.booleans(), label="share a prefix"):  # type: ignore[arg-type]
            base = data.draw(st.sampled_from(self.prompts))
            prefix = base[: data.draw(st.integers(0, len(base)))]
        suffix = data.draw(st.lists(VOCAB, min_size=0 if prefix else 1, max_size=3 * self.bs + 1), label="suffix")
        tokens = prefix + suffix
        self.prompts.append(tokens)
        self._admit(tokens)

    @precondition(lambda self: any(self.computed[s] < len(t) for s, t in self.live.items()))
    @rule(data=st.data())
    def prefill(self, data: st.DataObject) -> None:
        pending = sorted(s for s, t in self.live.items() if self.computed[s] < len(t))
        seq_id = data.draw(st.sampled_from(pending), label="request")
        start = self.computed[seq_id]
        end = data.draw(st.integers(start + 1, len(self.live[seq_id])), label="chunk end")
        self._write(seq_id, start, end)
        self.alloc.commit(seq_id, end)
        assert self.model is not None
        self.model.commit(seq_id, end)
        self.computed[seq_id] = end

    @precondition(lambda self: any(self.computed[s] == len(t) for s, t in self.live.items()))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        assert self.model is not None
        ready = sorted(s for s, t in self.live.items() if self.computed[s] == len(t))
        seq_id = data.draw(st.sampled_from(ready), label="request")
        token = data.draw(VOCAB, label="token")
        before = snapshot(self.alloc)
        predicted = self.model.append_token(seq_id, token)
        if predicted is None:
            with pytest.raises(Exception):  # noqa: B017
                self.alloc.append_token(seq_id, token)
            assert snapshot(self.alloc) == before, "a refused append changed the pool or the hash map"
            return
        assert self.alloc.append_token(seq_id, token) == predicted
        self.live[seq_id].append(token)
        n = len(self.live[seq_id])
        self._write(seq_id, n - 1, n)
        self.alloc.commit(seq_id, n)
        self.model.commit(seq_id, n)
        self.computed[seq_id] = n

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), preempt=st.booleans())
    def finish_or_preempt(self, data: st.DataObject, preempt: bool) -> None:
        assert self.model is not None
        seq_id = data.draw(st.sampled_from(sorted(self.live)), label="request")
        self.alloc.free(seq_id)
        self.model.free_seq(seq_id)
        tokens = self.live.pop(seq_id)
        del self.computed[seq_id]
        if preempt:
            self.preempted.append(tokens)

    @rule()
    def reset(self) -> None:
        assert self.model is not None
        before = snapshot(self.alloc)
        if not self.model.reset():
            with pytest.raises(Exception):  # noqa: B017
                self.alloc.reset()
            assert snapshot(self.alloc) == before, "a refused reset changed the pool or the hash map"
            return
        self.alloc.reset()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def matches_the_specification(self) -> None:
        if self.model is None:
            return
        free = self.alloc.free_block_ids()
        assert free == self.model.free, f"free list {free}, spec says {self.model.free} (order included)"
        assert self.alloc.cached_blocks() == self.model.cached, "hash map differs from the specification"
        for seq_id in self.live:
            assert self.model_table(seq_id) == self.model.seqs[seq_id].table

    @invariant()
    def conservation_and_ref_counts(self) -> None:
        if self.model is None:
            return
        n = self.alloc.num_blocks
        free = self.alloc.free_block_ids()
        assert len(set(free)) == len(free), f"a block is twice in the free list: {free}"
        holders = Counter(b for s in self.live for b in self.model_table(s))
        refs = [self.alloc.ref_count(b) for b in range(n)]
        assert refs == [holders.get(b, 0) for b in range(n)], f"ref counts {refs}, tables hold {dict(holders)}"
        assert sorted(free) == [b for b in range(n) if refs[b] == 0]
        assert len(free) + sum(1 for r in refs if r > 0) == n

    @invariant()
    def tables_cover_the_tokens(self) -> None:
        for seq_id, tokens in self.live.items():
            assert len(self.model_table(seq_id)) == -(-len(tokens) // self.bs)

    @invariant()
    def memory_holds_each_requests_own_prefix(self) -> None:
        for seq_id, tokens in self.live.items():
            table = self.model_table(seq_id)
            for pos in range(self.computed[seq_id]):
                held = self.memory.get((table[pos // self.bs], pos % self.bs))
                assert held == tuple(tokens[: pos + 1]), (
                    f"request {seq_id} position {pos}: block {table[pos // self.bs]} holds K/V of prefix "
                    f"{held}, the request's prefix is {tuple(tokens[: pos + 1])}"
                )

    def teardown(self) -> None:
        if self.model is None:
            return
        for seq_id in list(self.live):
            self.alloc.free(seq_id)
        assert sorted(self.alloc.free_block_ids()) == list(range(self.alloc.num_blocks)), "blocks leaked"


HASHES = {"xxh64": block_hash, "all_equal": collide_all}


@pytest.mark.parametrize("hash_name", sorted(HASHES))
def test_allocator_state_machine(ir_adapter: Adapter, hash_name: str) -> None:
    """The allocator driven by random admissions, prefills, decodes and frees beside a model of the
    specification, its invariants checked after every step.

    Guards: *block hash not chained to its parent*, *hit accepted without verifying token ids*,
    *stale map entry on block reuse*, *revived block loses its hash*, *full-prompt hit computes
    nothing*, *own hit evicted*, *failed allocation leaks a ref*, *hash published before the write*.
    """
    hits = []

    def make() -> AllocatorMachine:
        machine = AllocatorMachine(ir_adapter, HASHES[hash_name])
        hits.append(machine)
        return machine

    current = settings()
    # A factory is what Hypothesis calls at run time; the annotation of this argument differs between
    # Hypothesis versions (a class, or a callable returning a machine), hence the cast.
    run_state_machine_as_test(
        cast(Any, make), settings=settings(current, max_examples=max(current.max_examples * 4, 40), stateful_step_count=40)
    )
    # With every hash equal the map holds one entry, so verified hits are rare by construction (that
    # variant checks that collisions never serve wrong blocks); with real hashes sharing must happen.
    if hash_name == "xxh64":
        assert sum(m.hits_seen for m in hits) > 0, "no prefix hit happened: the workload did not exercise sharing"


# -- scenarios with the block ids worked out by hand (the free order of the specification) ------
#
# A fresh pool hands out 0, 1, 2, ... in order; a finished request's blocks go to the tail of the
# free list last block first; hits are claimed before new blocks are taken.


def _allocator(ir_adapter: Adapter, num_blocks: int, block_size: int) -> Any:
    assert ir_adapter.make_block_manager is not None
    return ir_adapter.make_block_manager(num_blocks, block_size, block_hash)


def _run(alloc: Any, seq_id: int, tokens: list[int]) -> tuple[list[int], int]:
    """Admit and prefill a request (its K/V written, its full blocks published)."""
    table, cached = alloc.allocate(seq_id, tokens)
    alloc.commit(seq_id, len(tokens))
    return table, cached


def test_free_order_is_tail_first_then_least_recently_freed(ir_adapter: Adapter) -> None:
    alloc = _allocator(ir_adapter, 6, 2)
    assert _run(alloc, 0, [1, 1, 1, 1, 1]) == ([0, 1, 2], 0)
    assert _run(alloc, 1, [0, 0, 0]) == ([3, 4], 0)
    alloc.free(0)  # blocks 2, 1, 0 join the tail, last block first
    assert alloc.free_block_ids() == [5, 2, 1, 0]
    alloc.free(1)
    assert alloc.free_block_ids() == [5, 2, 1, 0, 4, 3]
    assert _run(alloc, 2, [7, 7, 7]) == ([5, 2], 0)  # no hit: least recently freed first


def test_own_hit_is_claimed_before_new_blocks(ir_adapter: Adapter) -> None:
    """Guards: *own hit evicted*."""
    alloc = _allocator(ir_adapter, 4, 2)
    assert _run(alloc, 0, [0, 0, 1]) == ([0, 1], 0)
    alloc.free(0)  # free: 2, 3, 1, 0
    assert _run(alloc, 1, [5, 5, 5, 5]) == ([2, 3], 0)
    alloc.free(1)  # free: 1, 0, 3, 2 -- the cached block 0 sits second
    # Hit on block 0 ([0, 0]); three new blocks. Taking them first would hand out block 0 itself.
    assert _run(alloc, 2, [0, 0, 7, 7, 7, 7, 7]) == ([0, 1, 3, 2], 2)


def test_hit_never_covers_the_last_prompt_token(ir_adapter: Adapter) -> None:
    """Guards: *full-prompt hit computes nothing*."""
    alloc = _allocator(ir_adapter, 8, 2)
    _run(alloc, 0, [3, 4, 5, 6])
    table, cached = alloc.allocate(1, [3, 4, 5, 6])  # block-aligned repeat: the second block is recomputed
    assert cached == 2 and table[0] == 0 and table[1] != 1
    assert alloc.allocate(2, [3, 4, 5, 6, 9])[1] == 4


def test_evicting_block_i_of_a_chain_stops_hits_at_i(ir_adapter: Adapter) -> None:
    """Hits stop where a chain's block was taken for new content (the ids follow the claim order).

    Guards: *own hit evicted*.
    """
    alloc = _allocator(ir_adapter, 5, 1)
    assert _run(alloc, 0, [1, 2, 3, 4]) == ([0, 1, 2, 3], 0)
    alloc.free(0)  # free: 4, 3, 2, 1, 0
    assert _run(alloc, 1, [9, 9]) == ([4, 3], 0)  # block 3, depth 3 of the chain, is taken for new content
    alloc.free(1)  # free: 2, 1, 0, 3, 4
    assert alloc.allocate(2, [1, 2, 3, 4, 5]) == ([0, 1, 2, 3, 4], 3)  # hits stop at depth 3


# -- one scenario per prefix-cache bug class ----------------------------------------------------
#
# The state machine guards all eight classes at once, so its failure alone cannot say which one
# broke. Each scenario below exercises one mechanism and reads only what that mechanism decides, so
# every bug of its class fails it and a passing scenario clears its class in the report's blame.


def test_published_hashes_are_chained_to_their_parents(ir_adapter: Adapter) -> None:
    """One request of two identical full blocks: the hash map holds ``h0 = hash(None, [1, 1])`` ->
    block 0 and ``hash(h0, [1, 1])`` -> block 1 (two entries: an unchained hash gives both blocks
    the same key).

    Guards: *block hash not chained to its parent*."""
    alloc = _allocator(ir_adapter, 4, 2)
    assert _run(alloc, 0, [1, 1, 1, 1, 5]) == ([0, 1, 2], 0)
    h0 = block_hash(None, [1, 1])
    assert alloc.cached_blocks() == {h0: 0, block_hash(h0, [1, 1]): 1}, f"hash map {alloc.cached_blocks()}"


def test_a_colliding_hash_is_not_a_hit(ir_adapter: Adapter) -> None:
    """With every hash equal, a prompt whose first block has other token ids than the cached one
    gets no hit (only comparing the token ids can tell them apart).

    Guards: *hit accepted without verifying token ids*."""
    assert ir_adapter.make_block_manager is not None
    alloc = ir_adapter.make_block_manager(4, 2, collide_all)
    _run(alloc, 0, [1, 1, 5])
    _, cached = alloc.allocate(1, [0, 0, 5])
    assert cached == 0, f"a hit of {cached} tokens on block 0, which holds [1, 1], for the prompt's [0, 0]"


def test_a_block_taken_for_new_content_leaves_the_hash_map(ir_adapter: Adapter) -> None:
    """Request 0 publishes block 0 ([1, 1]) and finishes; request 1 (no hit) takes every block, block
    0 included, for new content: the map no longer sends ``hash(None, [1, 1])`` to block 0 (only the
    old entry is read, so the hashing of request 1's blocks plays no part).

    Guards: *stale map entry on block reuse*."""
    alloc = _allocator(ir_adapter, 2, 2)
    assert _run(alloc, 0, [1, 1, 5]) == ([0, 1], 0)
    alloc.free(0)  # free: 1, 0
    assert _run(alloc, 1, [0, 0, 0, 0]) == ([1, 0], 0)
    stale = alloc.cached_blocks().get(block_hash(None, [1, 1]))
    assert stale is None, f"the hash of [1, 1] still maps to block {stale}, which now holds [0, 0]"


def test_a_revived_block_stays_published(ir_adapter: Adapter) -> None:
    """Request 0 publishes block 0 ([1, 1]) and finishes; request 1 revives it by a hit: block 0 stays
    in the hash map, and a third request hits it too.

    Guards: *revived block loses its hash*."""
    alloc = _allocator(ir_adapter, 8, 2)
    assert _run(alloc, 0, [1, 1, 5]) == ([0, 1], 0)
    alloc.free(0)
    assert _run(alloc, 1, [1, 1, 7])[1] == 2
    assert alloc.cached_blocks().get(block_hash(None, [1, 1])) == 0, f"hash map {alloc.cached_blocks()}"
    assert alloc.allocate(2, [1, 1, 8])[1] == 2


def test_a_refused_allocation_gives_back_its_hits(ir_adapter: Adapter) -> None:
    """A two-block pool: request 1 hits request 0's freed block 0 but needs two new blocks where one is
    free, so it is refused, and the pool, ref counts and map are as before.

    Guards: *failed allocation leaks a ref*."""
    alloc = _allocator(ir_adapter, 2, 2)
    _run(alloc, 0, [1, 1, 5])
    alloc.free(0)
    before = snapshot(alloc)
    with pytest.raises(Exception):  # noqa: B017 - any refusal, as long as nothing changed
        alloc.allocate(1, [1, 1, 9, 9, 9])
    assert snapshot(alloc) == before, f"after the refusal {snapshot(alloc)}, before {before}"


def test_an_unwritten_block_is_not_a_hit(ir_adapter: Adapter) -> None:
    """Request 0 is allocated but nothing of it is computed yet: request 1 with the same first block
    gets no hit (its K/V do not exist).

    Guards: *hash published before the write*."""
    alloc = _allocator(ir_adapter, 8, 2)
    alloc.allocate(0, [1, 1, 5])
    _, cached = alloc.allocate(1, [1, 1, 6])
    assert cached == 0, f"a hit of {cached} tokens on request 0's block, whose K/V were never written"
