"""Scheduler: budgets, preemption, prefix-reuse order and starvation, driven by random workloads."""
from __future__ import annotations

import random

import pytest

from batchinfer.engine.kvcache.block_manager import BlockManager
from batchinfer.engine.config import EngineConfig
from batchinfer.engine.scheduler.scheduler import Scheduler
from batchinfer.engine.scheduler.sequence import Sequence, SequenceStatus
from batchinfer.engine.types import SamplingParams

pytestmark = pytest.mark.fast


def make_scheduler(num_blocks=64, block_size=4, **cfg) -> Scheduler:
    config = EngineConfig(block_size=block_size, **cfg)
    return Scheduler(config, BlockManager(num_blocks, block_size))


def max_tokens_check(seq: Sequence) -> str | None:
    return "length" if seq.num_output_tokens >= seq.sampling.max_tokens else None


def run_step(sched: Scheduler, rng: random.Random) -> tuple[list[Sequence], list[Sequence]]:
    seqs = sched.schedule()
    sched.last_step_tokens = sum(s.num_new_tokens for s in seqs)
    sampled = {s.request_id: rng.randrange(7) for s in seqs if s.samples_this_step()}
    return seqs, sched.postprocess(seqs, sampled, max_tokens_check)


def holders(sched: Scheduler) -> list[Sequence]:
    return sched.running + [s for s in sched.waiting if s.block_table]


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_respects_budgets_and_finishes_everything(seed):
    rng = random.Random(seed)
    sched = make_scheduler(num_blocks=40, max_num_seqs=6, max_num_batched_tokens=24)
    prefixes = [[rng.randrange(7) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    added, finished, steps = 0, set(), 0
    while added < 300 or sched.has_unfinished():
        for _ in range(min(rng.randrange(3), 300 - added)):
            tokens = rng.choice(prefixes) + [rng.randrange(7) for _ in range(rng.randrange(1, 20))]
            sched.add(Sequence(f"r{added}", tokens, SamplingParams(max_tokens=rng.randrange(1, 12))))
            added += 1
        seqs, done = run_step(sched, rng)
        steps += 1
        assert sched.last_step_tokens <= 24
        assert len(sched.running) <= 6
        assert all(s.status == SequenceStatus.FINISHED and not s.block_table for s in done)
        finished.update(s.request_id for s in done)
        sched.block_manager.check_integrity(holders(sched))
        assert steps < 20000, "the scheduler stopped making progress"
    assert len(finished) == 300
    assert sched.num_preemptions > 0, "40 blocks for 6 sequences should force preemption"


def test_step_never_exceeds_the_token_budget():
    rng = random.Random(7)
    sched = make_scheduler(num_blocks=400, max_num_seqs=16, max_num_batched_tokens=32)
    for i in range(40):
        sched.add(Sequence(f"r{i}", [rng.randrange(50) for _ in range(rng.randrange(1, 90))], SamplingParams(max_tokens=5)))
    while sched.has_unfinished():
        seqs = sched.schedule()
        assert sum(s.num_new_tokens for s in seqs) <= 32
        assert len(seqs) <= 16
        sched.postprocess(seqs, {s.request_id: 1 for s in seqs if s.samples_this_step()}, max_tokens_check)


def test_long_prompt_is_prefilled_in_chunks_while_decodes_continue():
    sched = make_scheduler(num_blocks=100, max_num_batched_tokens=16)
    short = Sequence("short", [1, 2, 3], SamplingParams(max_tokens=20))
    sched.add(short)
    rng = random.Random(0)
    run_step(sched, rng)
    long = Sequence("long", list(range(100)), SamplingParams(max_tokens=2))
    sched.add(long)
    chunks = []
    while long.num_output_tokens == 0:
        seqs, _ = run_step(sched, rng)
        assert short in seqs, "the decode must run in every step"
        chunks.append(next((s for s in seqs if s is long), None))
    assert len(chunks) >= 100 // 15


def test_waiting_queue_prefers_the_longest_cached_prefix():
    sched = make_scheduler(num_blocks=100, max_num_seqs=1)
    shared = list(range(40))
    first = Sequence("first", shared + [1], SamplingParams(max_tokens=1))
    sched.add(first)
    rng = random.Random(0)
    run_step(sched, rng)  # first finishes, its blocks stay cached
    sched.add(Sequence("unrelated", [9] * 41, SamplingParams(max_tokens=1)))
    sched.add(Sequence("sibling", shared + [2], SamplingParams(max_tokens=1)))
    seqs = sched.schedule()
    assert [s.request_id for s in seqs] == ["sibling"]
    assert seqs[0].num_cached_tokens == 40


def test_passed_over_request_is_not_starved():
    sched = make_scheduler(num_blocks=200, max_num_seqs=1, starvation_steps=3)
    shared = list(range(40))
    rng = random.Random(0)
    sched.add(Sequence("seed", shared + [0], SamplingParams(max_tokens=1)))
    run_step(sched, rng)
    sched.add(Sequence("loner", [9] * 41, SamplingParams(max_tokens=1)))
    order = []
    for i in range(10):
        sched.add(Sequence(f"sib{i}", shared + [i + 1], SamplingParams(max_tokens=1)))
        seqs, _ = run_step(sched, rng)
        order += [s.request_id for s in seqs]
    assert "loner" in order[:5], order


def test_preempted_sequence_restarts_from_scratch_and_keeps_its_tokens():
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=4)
    rng = random.Random(0)
    # Each fits alone (7 + 17 tokens = 6 blocks), both together do not.
    a = Sequence("a", list(range(7)), SamplingParams(max_tokens=17))
    b = Sequence("b", list(range(50, 57)), SamplingParams(max_tokens=17))
    sched.add(a)
    sched.add(b)
    for _ in range(40):
        if sched.num_preemptions:
            break
        run_step(sched, rng)
        sched.block_manager.check_integrity(holders(sched))
    victim = b if b.status == SequenceStatus.WAITING else a
    assert victim.num_computed_tokens == 0 and not victim.block_table
    assert victim.num_output_tokens > 0
    kept = list(victim.token_ids)
    for _ in range(100):
        if victim.status == SequenceStatus.FINISHED:
            break
        run_step(sched, rng)
        sched.block_manager.check_integrity(holders(sched))
    assert victim.status == SequenceStatus.FINISHED
    assert victim.token_ids[:len(kept)] == kept


def test_a_prompt_of_n_samples_takes_n_seats_but_never_waits_forever():
    from batchinfer.engine.scheduler.parallel_sampling import PromptSequence

    bm = BlockManager(64, 4)
    sched = Scheduler(EngineConfig(max_num_seqs=4, max_num_batched_tokens=100), bm)
    sched.add(Sequence("a", [1, 2, 3], SamplingParams()))
    sched.add(PromptSequence("p", [4, 5, 6], SamplingParams(), num_samples=4))
    assert [s.request_id for s in sched.schedule()] == ["a"]  # 1 + 4 seats > 4: the prompt waits
    sched.finish(sched.running[0], "stop")
    assert [s.request_id for s in sched.schedule()] == ["p"]  # alone it runs, even when n > max_num_seqs
