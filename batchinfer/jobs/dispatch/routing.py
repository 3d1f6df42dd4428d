"""Which Celery queue a work unit goes to: the worker that holds its prefix, without leaving any idle.

Every worker consumes the shared queue and its own queue (worker_queue). A unit whose prefix group
is worth routing (non-empty prefix_key) goes to the own queue of the worker that holds the prefix:
one that has run the group before, else a sticky choice made here (least loaded, ties broken by
rendezvous hashing of the key, so every dispatcher picks the same worker). Load spills a group to
a second worker rather than letting one queue grow while another is empty; runtime imbalance is
fixed by idle workers stealing from busy workers' queues (cluster.registry.steal_one), and a dead
worker's queue is drained to its model's queue (reaper). Each model's units are routed among the
workers of that model only (dispatch.planning), and go to model_queue rather than the shared queue.

A group of a LoRA adapter's lines prefers, after a holder of its prefix, a worker that holds the adapter loaded
(it ran the adapter lately, or got one of its groups earlier in this plan), else the adapter's rendezvous owner: an
adapter's groups gather on few workers, which load it once, as long as those stay within their fair share.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

SHARED_QUEUE = "batchinfer"


def worker_queue(worker_name: str) -> str:
    """The queue only one worker consumes (besides the shared one)."""
    return f"{SHARED_QUEUE}.worker.{worker_name}"


def model_queue(model: str) -> str:
    """The queue every worker of one model consumes: its units without a prefix worth routing, units
    stolen from a busy peer of that model, and a dead peer's queue. Units never go to the shared queue,
    which every worker of every model consumes (dispatch, validation, estimates)."""
    return f"{SHARED_QUEUE}.model.{model}"


@dataclass
class WorkerLoad:
    name: str
    backlog: float = 0.0  # units already queued for it (a running one counts half)
    busy: bool = False
    holds: frozenset[str] = field(default_factory=frozenset)  # prefix keys it ran recently
    model: str = ""  # the model it serves ("": unknown, a worker from before fleets served several)
    adapters: frozenset[str] = field(default_factory=frozenset)  # LoRA adapters it ran lately (its engine holds them)


def rendezvous_order(prefix_key: str, workers: list[str]) -> list[str]:
    """Highest-random-weight order: stable per key, and only the keys of a leaving worker move."""
    def weight(name: str) -> bytes:
        return hashlib.blake2b(f"{prefix_key}\0{name}".encode(), digest_size=8).digest()
    return sorted(set(workers), key=weight, reverse=True)


def choose_queue(prefix_key: str, live_workers: list[str], *, loads: dict[str, float] | None = None,
                 holders: list[str] | tuple[str, ...] = (), busy_threshold: float = 1) -> str:
    """One unit on its own: the least loaded live holder of the prefix, else its rendezvous owner.

    The shared queue when there is no group (empty key), no live worker, or the chosen worker has
    more than busy_threshold queued while another live worker has nothing queued.
    """
    live = sorted(set(live_workers))
    if not prefix_key or not live:
        return SHARED_QUEUE
    loads = loads or {}
    holding = [w for w in live if w in holders]
    owner = min(holding, key=lambda w: loads.get(w, 0)) if holding else rendezvous_order(prefix_key, live)[0]
    idle_elsewhere = any(loads.get(w, 0) == 0 for w in live if w != owner)
    if loads.get(owner, 0) > busy_threshold and idle_elsewhere:
        return SHARED_QUEUE
    return worker_queue(owner)


def route_units(units: list[tuple[str, int]], workers: list[WorkerLoad], slack: float = 0.25,
                backlog_unit_cost: float | None = None, adapters: Sequence[str] = ()) -> list[str]:
    """Queues for a whole plan of (prefix_key, cost) units, in plan order; adapters: each unit's adapter ("": the
    base), when given.

    A worker's backlog counts as backlog_unit_cost per unit (default: this plan's mean unit cost).
    Groups are placed largest first on the least loaded worker (a holder of the prefix when one
    is below its fair share, else for an adapter's group a holder of the adapter), and a group spills to the
    next least loaded worker once its owner would exceed the fair share by more than `slack`. Units without a
    group go to the shared queue.
    """
    queues = [SHARED_QUEUE] * len(units)
    if not workers:
        return queues
    if backlog_unit_cost is None:
        backlog_unit_cost = sum(cost for _, cost in units) / max(len(units), 1)
    load = {w.name: w.backlog * backlog_unit_cost for w in workers}
    holding = {w.name: set(w.adapters) for w in workers}  # what it holds loaded, and what this plan gives it
    adapter_of = dict(zip((key for key, _ in units), adapters))
    members: dict[str, list[int]] = {}
    for i, (key, _) in enumerate(units):
        if key:
            members.setdefault(key, []).append(i)
    limit = (sum(load.values()) + sum(units[i][1] for ids in members.values() for i in ids)) / len(workers)
    limit *= 1 + slack
    for key in sorted(members, key=lambda k: (-sum(units[i][1] for i in members[k]), k)):
        adapter = adapter_of.get(key, "")
        owner = _pick_owner(key, adapter, workers, load, limit / (1 + slack), holding)
        for i in members[key]:
            cost = units[i][1]
            if load[owner] > 0 and load[owner] + cost > limit:
                owner = min(rendezvous_order(key, list(load)), key=lambda w: load[w])
            load[owner] += cost
            queues[i] = worker_queue(owner)
            if adapter:
                holding[owner].add(adapter)
    return queues


def _pick_owner(key: str, adapter: str, workers: list[WorkerLoad], load: dict[str, float], fair: float,
                holding: dict[str, set[str]]) -> str:
    below = [w.name for w in workers if load[w.name] < fair]
    holders = [w.name for w in workers if key in w.holds and w.name in below]
    if not holders and adapter:
        holders = [name for name in below if adapter in holding[name]]
    candidates = holders or rendezvous_order(adapter_route_key(adapter) if adapter else key, [w.name for w in workers])
    return min(candidates, key=lambda w: load[w])  # min keeps the first (rendezvous) order on ties


def adapter_route_key(adapter: str) -> str:
    """What an adapter's groups are hashed by when no worker holds it: every one of its groups, one owner."""
    return f"lora\0{adapter}"
