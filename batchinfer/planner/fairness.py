"""Order work units so job priority is honoured and a big job cannot starve a small one.

Priority is strict between classes (an aged job climbs classes, so nothing waits forever when
priority_aging_s is set). Within a class, units keep their depth-first order per job, and the
next unit is always one serving the job that has received the least work so far (fair share in
tokens, ties to the earlier job): a small job submitted after a big one is interleaved at once.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict

from batchinfer.planner.types import PendingRequest, PlannerConfig


def effective_priority(req: PendingRequest, config: PlannerConfig) -> int:
    if not config.priority_aging_s:
        return req.priority
    now = time.time() if config.now is None else config.now
    return req.priority + max(0, math.floor((now - req.submitted_at) / config.priority_aging_s))


def priority_classes(pending: list[PendingRequest], config: PlannerConfig) -> list[list[PendingRequest]]:
    """Requests split by effective priority, highest class first."""
    classes: dict[int, list[PendingRequest]] = defaultdict(list)
    for req in pending:
        classes[effective_priority(req, config)].append(req)
    return [classes[p] for p in sorted(classes, reverse=True)]


def fair_order(units: list[list[PendingRequest]]) -> list[list[PendingRequest]]:
    """Interleave units (given in depth-first order) by least-served job first."""
    by_job: dict[str, list[int]] = defaultdict(list)
    arrival: dict[str, tuple[float, str]] = {}
    for i, unit in enumerate(units):
        for job in dict.fromkeys(r.job_id for r in unit):
            by_job[job].append(i)
    for unit in units:
        for r in unit:
            arrival.setdefault(r.job_id, (r.submitted_at, r.job_id))
            arrival[r.job_id] = min(arrival[r.job_id], (r.submitted_at, r.job_id))
    served = dict.fromkeys(by_job, 0)
    cursor = dict.fromkeys(by_job, 0)
    emitted = [False] * len(units)
    out: list[list[PendingRequest]] = []
    while len(out) < len(units):
        job = min((j for j in by_job if cursor[j] < len(by_job[j])), key=lambda j: (served[j], arrival[j]))
        i = by_job[job][cursor[job]]
        emitted[i] = True
        out.append(units[i])
        for r in units[i]:
            served[r.job_id] += r.cost
        for j in dict.fromkeys(r.job_id for r in units[i]):
            while cursor[j] < len(by_job[j]) and emitted[by_job[j][cursor[j]]]:
                cursor[j] += 1
    return out


ATTAINED_UNITS_BOUNDS = (1, 4, 16)  # a job's first unit, its next 3, next 12, then the rest
SERVICE_LEVELS = len(ATTAINED_UNITS_BOUNDS) + 1  # 0 runs first; the cluster maps each to a broker priority


def service_levels(units: list, served_units: dict[str, int],
                   job_priority: dict[str, int] | None = None) -> list[int]:
    """Service level (0 first .. SERVICE_LEVELS - 1 last) of each unit, least attained service first: a
    unit runs as early as the job in it that has received the fewest units so far, across dispatch rounds.

    A big job already running has many units behind it, so the first units of a job submitted
    later overtake them in every queue; each job priority level moves a job one step earlier.
    """
    served = dict(served_units)
    job_priority = job_priority or {}
    out = []
    for unit in units:
        jobs = dict.fromkeys(r.job_id for r in unit.requests)
        step = min(_las_step(served.get(j, 0)) - job_priority.get(j, 0) for j in jobs)
        out.append(min(max(step, 0), SERVICE_LEVELS - 1))
        for j in jobs:
            served[j] = served.get(j, 0) + 1
    return out


def _las_step(attained: int) -> int:
    return sum(attained >= bound for bound in ATTAINED_UNITS_BOUNDS)
