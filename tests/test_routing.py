"""Routing of units to worker queues, and the worker registry, agent and reaper on a real Redis."""
from __future__ import annotations

import random
import json
import time
import uuid

import pytest
import redis

from batchinfer.jobs.dispatch.routing import (SHARED_QUEUE, WorkerLoad, choose_queue, rendezvous_order, route_units,
                                worker_queue)
from batchinfer.cluster.agent import WorkerAgent
from batchinfer.cluster.registry import WorkerRegistry, WorkerState



def owner_of(queue: str) -> str:
    return queue.rsplit(".", 1)[1]


@pytest.mark.fast
def test_units_without_a_group_or_without_live_workers_go_to_the_shared_queue():
    assert choose_queue("", ["w1", "w2"]) == SHARED_QUEUE
    assert choose_queue("abc", []) == SHARED_QUEUE
    assert route_units([("", 10), ("k", 10)], []) == [SHARED_QUEUE, SHARED_QUEUE]
    assert route_units([("", 10)], [WorkerLoad("w1")]) == [SHARED_QUEUE]


@pytest.mark.fast
def test_a_prefix_key_always_picks_the_same_live_worker():
    workers = [f"w{i}" for i in range(5)]
    for key in (f"key{i}" for i in range(50)):
        first = choose_queue(key, workers)
        assert first == choose_queue(key, list(reversed(workers)))
        assert first in {worker_queue(w) for w in workers}


@pytest.mark.fast
def test_a_leaving_worker_moves_only_its_own_keys():
    workers = [f"w{i}" for i in range(4)]
    keys = [f"key{i}" for i in range(400)]
    before = {k: choose_queue(k, workers) for k in keys}
    after = {k: choose_queue(k, workers[:-1]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == worker_queue("w3") for k in moved)
    assert 60 < len(moved) < 140  # about a quarter of the keys lived on w3


@pytest.mark.fast
def test_the_holder_of_a_prefix_wins_unless_it_is_swamped_while_another_idles():
    key = "k1"
    not_owner = [w for w in ("w1", "w2") if worker_queue(w) != choose_queue(key, ["w1", "w2"])][0]
    assert choose_queue(key, ["w1", "w2"], holders=[not_owner]) == worker_queue(not_owner)
    other = "w1" if not_owner == "w2" else "w2"
    assert choose_queue(key, ["w1", "w2"], holders=[not_owner], loads={not_owner: 5, other: 0}) == SHARED_QUEUE
    assert choose_queue(key, ["w1", "w2"], holders=[not_owner], loads={not_owner: 5, other: 3}) == worker_queue(not_owner)


@pytest.mark.fast
def test_equal_groups_are_balanced_and_never_split():
    units = [(k, 100) for k in "abcd" for _ in range(6)]
    queues = route_units(units, [WorkerLoad("w1"), WorkerLoad("w2")])
    per_group = {}
    for (key, _), q in zip(units, queues):
        per_group.setdefault(key, set()).add(q)
    assert all(len(qs) == 1 for qs in per_group.values())
    owners = [qs.pop() for qs in per_group.values()]
    assert sorted(owners.count(worker_queue(w)) for w in ("w1", "w2")) == [2, 2]


@pytest.mark.fast
def test_one_huge_group_spills_so_no_worker_idles():
    queues = route_units([("big", 100)] * 20, [WorkerLoad("w1"), WorkerLoad("w2"), WorkerLoad("w3")])
    counts = sorted(queues.count(worker_queue(w)) for w in ("w1", "w2", "w3"))
    assert counts[0] >= 4 and sum(counts) == 20


@pytest.mark.fast
def test_groups_go_to_their_holder_and_around_a_backlog():
    units = [("a", 100)] * 3 + [("b", 100)] * 3
    queues = route_units(units, [WorkerLoad("w1", holds=frozenset({"b"})), WorkerLoad("w2", holds=frozenset({"a"}))])
    assert set(queues[:3]) == {worker_queue("w2")} and set(queues[3:]) == {worker_queue("w1")}
    queues = route_units(units, [WorkerLoad("w1", backlog=10), WorkerLoad("w2")])
    assert queues.count(worker_queue("w2")) == 6  # w1 has more than this whole plan queued already


@pytest.mark.fast
@pytest.mark.parametrize("seed", range(8))
def test_random_plans_stay_within_the_fair_share_and_keep_small_groups_whole(seed):
    rng = random.Random(seed)
    workers = [WorkerLoad(f"w{i}", backlog=rng.choice([0, 0, 3])) for i in range(rng.randint(1, 5))]
    units = [(f"g{rng.randrange(12)}" if rng.random() < 0.9 else "", rng.randint(50, 150)) for _ in range(rng.randint(1, 80))]
    slack = 0.25
    queues = route_units(units, workers, slack, backlog_unit_cost=100)
    load = {w.name: w.backlog * 100 for w in workers}
    for (key, cost), q in zip(units, queues):
        assert (q == SHARED_QUEUE) == (key == "")
        if key:
            load[owner_of(q)] += cost
    fair = sum(load.values()) / len(workers)
    assert max(load.values()) <= max(fair * (1 + slack) + 150, max(w.backlog for w in workers) * 100 + 150)
    total = {k: sum(c for kk, c in units if kk == k) for k, _ in units if k}
    for key, cost in total.items():
        holders = {q for (k, _), q in zip(units, queues) if k == key}
        if cost <= fair * slack:  # a group that fits in the slack is never split
            assert len(holders) == 1, (key, holders)


@pytest.mark.fast
def test_rendezvous_order_is_a_permutation():
    assert sorted(rendezvous_order("x", ["a", "b", "c", "b"])) == ["a", "b", "c"]


# ---- registry and agent against a real Redis (the sweep: test_sweep.py) ----

@pytest.fixture
def registry(redis_server):
    conn = redis.Redis.from_url(f"{redis_server}/0")
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    yield WorkerRegistry(conn, key_prefix=prefix, ttl_s=0.5)
    for k in conn.scan_iter(match=prefix + "*"):
        conn.delete(k)


def push(registry: WorkerRegistry, queue: str, *messages: str, priority: int = 0) -> None:
    key = registry.key_prefix + queue + (f"\x06\x16{priority}" if priority else "")
    for m in messages:  # as kombu's Redis transport publishes: LPUSH, consumed by BRPOP
        registry.conn.lpush(key, m)


def contents(registry: WorkerRegistry, queue: str, priority: int = 0) -> list[str]:
    key = registry.key_prefix + queue + (f"\x06\x16{priority}" if priority else "")
    return [m.decode() for m in registry.conn.lrange(key, 0, -1)]


def test_a_worker_that_stops_beating_is_dead_and_a_leaving_one_is_not(registry):
    registry.beat(WorkerState("w1"))
    registry.beat(WorkerState("w2", busy=True, unit_id="u7"))
    registry.beat(WorkerState("w3"))
    assert [w.name for w in registry.live()] == ["w1", "w2", "w3"]
    registry.leave("w3")
    time.sleep(0.7)
    registry.beat(WorkerState("w1"))
    assert [w.name for w in registry.live()] == ["w1"]
    dead = registry.dead()
    assert [(w.name, w.unit_id) for w in dead] == [("w2", "u7")]


def test_loads_count_queued_units_and_held_prefixes(registry):
    state = WorkerState("w1", busy=True)
    state.ran("k1")
    state.ran("k2")
    state.ran("k1")
    assert state.prefix_keys == ["k1", "k2"]
    registry.beat(state)
    registry.beat(WorkerState("w2"))
    push(registry, worker_queue("w1"), "m1", "m2")
    loads = {w.name: w for w in registry.loads()}
    assert loads["w1"].backlog == 2.5 and loads["w1"].holds == {"k1", "k2"} and loads["w2"].backlog == 0


def test_an_idle_worker_steals_the_newest_unit_of_a_busy_peer(registry):
    registry.beat(WorkerState("w1", busy=True))
    registry.beat(WorkerState("w2"))
    push(registry, worker_queue("w1"), "oldest", "middle", "newest")
    assert registry.steal_one("w2") == "w1"
    assert contents(registry, worker_queue("w1")) == ["middle", "oldest"]  # its own order is kept
    assert contents(registry, SHARED_QUEUE) == ["newest"]
    registry.beat(WorkerState("w1", busy=False))
    assert registry.steal_one("w2") is None  # an idle owner will run its own queue


def test_stealing_and_draining_keep_broker_priorities(registry):
    registry.beat(WorkerState("w1", busy=True))
    registry.beat(WorkerState("w2"))
    push(registry, worker_queue("w1"), "first", priority=0)
    push(registry, worker_queue("w1"), "late-a", "late-b", priority=9)
    assert registry.queue_depth(worker_queue("w1")) == 3
    assert registry.steal_one("w2") == "w1"
    assert contents(registry, SHARED_QUEUE, priority=9) == ["late-b"]  # what w1 would have run last
    assert registry.drain(worker_queue("w1")) == 2
    assert contents(registry, SHARED_QUEUE, priority=0) == ["first"]
    assert sorted(contents(registry, SHARED_QUEUE, priority=9)) == ["late-a", "late-b"]
    assert registry.queue_depth(worker_queue("w1")) == 0


def test_agent_beats_its_state_and_steals_only_when_idle(registry):
    registry.beat(WorkerState("busy", busy=True))
    push(registry, worker_queue("busy"), "u1", "u2")
    agent = WorkerAgent(registry, "thief", beat_s=60)
    agent.start()
    try:
        agent.unit_started("u9")
        assert {w.name: w.unit_id for w in registry.live()}["thief"] == "u9"
        agent.tick()
        assert contents(registry, SHARED_QUEUE) == []  # busy: no stealing
        agent.unit_finished("pk", work_tokens=1000, seconds=2.0)
        me = {w.name: w for w in registry.live()}["thief"]
        assert not me.busy and me.prefix_keys == ["pk"] and me.prefill_tokens_per_s == 500
        agent.tick()
        assert contents(registry, SHARED_QUEUE) == ["u2"]
        push(registry, worker_queue("thief"), "mine")
    finally:
        agent.stop()
    assert "thief" not in {w.name for w in registry.live()}
    assert contents(registry, worker_queue("thief")) == [] and "mine" in contents(registry, SHARED_QUEUE)
    assert [w.name for w in registry.dead()] == ["thief"]  # peers keep draining what Redis restores later


def test_queued_unit_ids_reads_unit_ids_from_celery_messages(registry):
    message = json.dumps({"body": "e30=", "headers": {"task": "batchinfer.run_unit", "argsrepr": "['unit_abc']"}})
    registry.beat(WorkerState("w1"))
    push(registry, worker_queue("w1"), message)
    push(registry, SHARED_QUEUE, message.replace("unit_abc", "unit_def"), priority=3)
    push(registry, SHARED_QUEUE, "not json")
    assert registry.queued_unit_ids() == {"unit_abc", "unit_def"}


def test_each_service_level_gets_its_own_broker_priority_step_in_order():
    from batchinfer.cluster.broker import broker_priority
    from batchinfer.planner.fairness import SERVICE_LEVELS

    # kombu's Redis transport serves the lists of steps 0, 3, 6, 9 in that order; priorities between steps
    # would share a list, so each level must land on a step of its own.
    assert [broker_priority(level) for level in range(SERVICE_LEVELS)] == [0, 3, 6, 9]


def test_a_fleet_of_models_steals_drains_and_finds_units_within_each_model(registry):
    from batchinfer.jobs.dispatch.routing import model_queue

    registry = WorkerRegistry(registry.conn, registry.key_prefix, ttl_s=60)  # nobody goes silent here
    registry.beat(WorkerState("a1", busy=True, model="m-a", model_path="/models/a"))
    registry.beat(WorkerState("b1", busy=True, model="m-b"))
    registry.beat(WorkerState("a2", model="m-a"))
    push(registry, worker_queue("b1"), "b-unit")
    assert registry.steal_one("a2", "m-a") is None  # a unit of another model is never taken
    push(registry, worker_queue("a1"), "a-old", "a-new")
    assert registry.steal_one("a2", "m-a") == "a1"
    assert contents(registry, model_queue("m-a")) == ["a-new"] and contents(registry, SHARED_QUEUE) == []
    assert registry.live_models() == {"m-a": "/models/a", "m-b": None}
    assert {w.name: w.model for w in registry.loads()} == {"a1": "m-a", "a2": "m-a", "b1": "m-b"}
    dead = {w.name: w for w in registry.live()}["b1"]
    assert registry.drain(dead.queue, dead.pool_queue) == 1 and contents(registry, model_queue("m-b")) == ["b-unit"]
    message = json.dumps({"body": "e30=", "headers": {"task": "batchinfer.run_unit", "argsrepr": "['unit_mb']"}})
    push(registry, model_queue("m-b"), message)
    assert registry.queued_unit_ids() == {"unit_mb"}  # the sweep sees units waiting in a model's queue


def adapter_owners(adapters, queues) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for adapter, q in zip(adapters, queues):
        found.setdefault(adapter, set()).add(owner_of(q))
    return found


@pytest.mark.fast
@pytest.mark.parametrize("seed", range(6))
def test_an_adapter_s_groups_gather_on_one_worker_within_its_fair_share(seed):
    rng = random.Random(seed)
    names = [f"a{rng.randrange(10**6)}", f"b{rng.randrange(10**6)}"]
    groups = [(f"g{i}", names[i % 2]) for i in range(8)]  # 4 prefix groups of each adapter, interleaved
    units = [(key, 100) for key, _ in groups]
    adapters = [adapter for _, adapter in groups]
    queues = route_units(units, [WorkerLoad("w1"), WorkerLoad("w2")], adapters=adapters)
    owners = adapter_owners(adapters, queues)
    assert all(len(o) == 1 for o in owners.values()), owners  # by prefix key alone they alternate over both
    assert owners[names[0]] != owners[names[1]]
    plain = route_units(units, [WorkerLoad("w1"), WorkerLoad("w2")])
    assert any(len(o) == 2 for o in adapter_owners(adapters, plain).values())


@pytest.mark.fast
def test_an_adapter_s_group_prefers_a_worker_holding_it_loaded_but_not_past_its_fair_share():
    workers = [WorkerLoad(f"w{i}") for i in range(4)]
    default = owner_of(route_units([("g", 100)], workers, adapters=["tuned"])[0])
    holder = next(w for w in workers if w.name != default)
    holder.adapters = frozenset({"tuned"})
    assert route_units([("g", 100)], workers, adapters=["tuned"]) == [worker_queue(holder.name)]
    holder.holds = frozenset({"g2"})  # a holder of the group's prefix comes first
    queues = route_units([("g2", 100)], workers, adapters=["other"])
    assert queues == [worker_queue(holder.name)]
    many = route_units([(f"g{i}", 100) for i in range(8)], workers, adapters=["tuned"] * 8)
    assert sorted(many.count(worker_queue(w.name)) for w in workers) == [2, 2, 2, 2]  # still spread evenly


def test_agent_reports_the_adapters_its_engine_holds(registry):
    agent = WorkerAgent(registry, "lora-worker", beat_s=60, max_loaded_adapters=2)
    agent.start()
    try:
        agent.unit_finished("pk", adapters=("a", "b"))
        agent.unit_finished("pk", adapters=("c",))
        me = {w.name: w for w in registry.live()}["lora-worker"]
        assert me.adapters == ["c", "b"]  # as the engine's LRU of 2: a was evicted
        load = {w.name: w for w in registry.loads()}["lora-worker"]
        assert load.adapters == frozenset({"b", "c"})
    finally:
        agent.stop()
