"""Block manager: reference counts, prefix sharing, LRU eviction, and integrity under random operations."""
from __future__ import annotations

import random

import pytest

from batchinfer.engine.kvcache.block_manager import BlockManager
from batchinfer.engine.scheduler.sequence import Sequence
from batchinfer.engine.types import SamplingParams

pytestmark = pytest.mark.fast

BS = 4


def make_seq(tokens: list[int], rid: str = "r", salt: str | None = None) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(temperature=0), cache_salt=salt)


def admit(bm: BlockManager, seq: Sequence) -> list[int]:
    hits = bm.match_prefix(seq)
    bm.allocate_prefix(seq, hits)
    bm.allocate_slots(seq, len(seq) - seq.num_computed_tokens)
    seq.num_computed_tokens = len(seq)
    return hits


def test_second_sequence_reuses_the_shared_full_blocks():
    bm = BlockManager(16, BS)
    a = make_seq(list(range(10)), "a")
    b = make_seq(list(range(8)) + [99, 98, 97], "b")
    admit(bm, a)
    hits = admit(bm, b)
    assert hits == a.block_table[:2]
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.check_integrity([a, b])


def test_blocks_are_shared_only_between_sequences_with_the_same_salt():
    bm = BlockManager(16, BS)
    admit(bm, make_seq(list(range(13)), "a", salt="scope-a"))
    assert admit(bm, make_seq(list(range(13)), "b", salt="scope-b")) == []
    assert admit(bm, make_seq(list(range(13)), "plain")) == []
    assert len(admit(bm, make_seq(list(range(13)), "a2", salt="scope-a"))) == 3
    assert len(bm.hash_to_block_id) == 9  # three chains of three full blocks, none shared across salts


def test_freed_blocks_stay_cached_and_are_reused_later():
    bm = BlockManager(16, BS)
    a = make_seq(list(range(9)), "a")
    admit(bm, a)
    first_two = a.block_table[:2]
    bm.free(a)
    assert set(first_two) <= set(bm.cached_block_ids)
    bm.check_integrity([])
    b = make_seq(list(range(9)), "b")
    assert admit(bm, b) == first_two
    bm.check_integrity([b])


def test_match_leaves_at_least_one_token_to_compute():
    bm = BlockManager(16, BS)
    a = make_seq(list(range(8)), "a")
    admit(bm, a)
    b = make_seq(list(range(8)), "b")
    assert len(bm.match_prefix(b)) == 1  # 8 tokens = 2 full blocks, but the last token must be recomputed


def test_eviction_takes_the_least_recently_freed_block_first():
    bm = BlockManager(4, BS)
    old, new = make_seq(list(range(4)) + [0], "old"), make_seq(list(range(100, 104)) + [0], "new")
    admit(bm, old)
    bm.free(old)
    admit(bm, new)
    bm.free(new)
    assert len(bm.cached_block_ids) == 2
    taker = make_seq(list(range(200, 211)), "taker")  # needs 3 blocks: 2 free + 1 evicted
    admit(bm, taker)
    assert bm.num_evictions == 1
    assert bm.match_prefix(make_seq(list(range(4)) + [0])) == []
    assert len(bm.match_prefix(make_seq(list(range(100, 104)) + [0]))) == 1
    bm.check_integrity([taker])


def test_can_allocate_counts_locked_cache_hits_as_unavailable():
    bm = BlockManager(3, BS)
    a = make_seq(list(range(8)) + [0], "a")
    admit(bm, a)
    bm.free(a)  # 2 cached + 1 free
    b = make_seq(list(range(8)) + [5, 6, 7, 8, 9], "b")  # reuses 2 blocks, needs 2 more: only 1 left
    hits = bm.match_prefix(b)
    assert len(hits) == 2
    assert not bm.can_allocate(b, len(b) - 8, hits)
    assert bm.can_allocate(b, 4, hits)


def _decode_one(bm: BlockManager, seq: Sequence, token: int) -> None:
    """A decode step of one sequence, as the scheduler makes it: the token is kept only if its slot fits."""
    seq.token_ids.append(token)
    if bm.can_allocate(seq, 1):
        bm.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
    else:
        seq.token_ids.pop()


@pytest.mark.parametrize("seed", range(3))
def test_random_operations_keep_integrity(seed):
    rng = random.Random(seed)
    bm = BlockManager(48, BS)
    prefixes = [[rng.randrange(5) for _ in range(rng.randrange(1, 14))] for _ in range(6)]
    live: list[Sequence] = []
    for step in range(2000):
        op = rng.random()
        if op < 0.35:
            tokens = rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.randrange(1, 10))]
            seq = make_seq(tokens, f"s{step}")
            hits = bm.match_prefix(seq)
            n = len(seq) - len(hits) * BS
            if bm.can_allocate(seq, n, hits):
                bm.allocate_prefix(seq, hits)
                bm.allocate_slots(seq, n)
                seq.num_computed_tokens = len(seq)
                live.append(seq)
        elif op < 0.75 and live:
            _decode_one(bm, rng.choice(live), rng.randrange(5))
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
        bm.check_integrity(live)
    assert bm.num_evictions > 0, "the random walk should have exercised eviction"


def test_fork_shares_every_block_and_the_first_write_copies_the_partial_one():
    bm = BlockManager(16, BS)
    parent = make_seq(list(range(10)), "p")  # 2 full blocks + 2 tokens in a third
    admit(bm, parent)
    children = [make_seq(list(range(10)) + [99], f"c{i}") for i in range(3)]
    for child in children:
        bm.fork(parent, child)
    bm.free(parent)
    assert all(c.block_table == children[0].block_table for c in children) and bm.num_forked_blocks == 9
    bm.check_integrity(children)
    partial = children[0].block_table[2]
    for child in children:
        assert bm.can_allocate(child, 1)
        bm.allocate_slots(child, 1)
        child.num_computed_tokens += 1
    copies = bm.take_copies()
    # the first two writers copy the shared partial block; the last holder writes into it in place
    assert copies == [(partial, children[0].block_table[2]), (partial, children[1].block_table[2])]
    assert children[2].block_table[2] == partial and bm.num_cow_copies == 2 and bm.take_copies() == []
    assert children[0].block_table[:2] == children[2].block_table[:2]  # full blocks stay shared
    bm.check_integrity(children)


def test_can_allocate_counts_the_copy_a_shared_partial_block_needs():
    bm = BlockManager(3, BS)
    parent = make_seq(list(range(10)), "p")
    admit(bm, parent)
    child = make_seq(list(range(11)), "c")
    bm.fork(parent, child)
    assert not bm.can_allocate(child, 1)  # every block is held: the copy has nowhere to go
    bm.free(parent)
    assert bm.can_allocate(child, 1)  # the child alone holds it now: it writes in place
    bm.allocate_slots(child, 1)
    assert bm.take_copies() == []


@pytest.mark.parametrize("seed", range(2))
def test_random_operations_with_forks_keep_integrity(seed):
    rng = random.Random(seed)
    bm = BlockManager(48, BS)
    live: list[Sequence] = []
    for step in range(2000):
        op = rng.random()
        if op < 0.25:
            seq = make_seq([rng.randrange(5) for _ in range(rng.randrange(1, 14))], f"s{step}")
            if bm.can_allocate(seq, len(seq)):
                bm.allocate_slots(seq, len(seq))
                seq.num_computed_tokens = len(seq)
                live.append(seq)
        elif op < 0.4 and live:
            parent = rng.choice(live)
            child = make_seq(list(parent.token_ids), f"f{step}")
            bm.fork(parent, child)
            live.append(child)
        elif op < 0.8 and live:
            _decode_one(bm, rng.choice(live), rng.randrange(5))
        elif live:
            bm.free(live.pop(rng.randrange(len(live))))
        bm.take_copies()
        bm.check_integrity(live)
    assert bm.num_cow_copies > 0, "the random walk should have copied a shared partial block"
