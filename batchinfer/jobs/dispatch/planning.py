"""Cut the pending requests of all queued jobs into work units and say where each unit should run.

Units may mix requests of several jobs (the planner groups shared prefixes across jobs), never of several
models: each model's requests are planned on their own and routed among that model's workers. The caller
enqueues the returned units (Celery) or runs them in-process (embedded).
"""
from __future__ import annotations

import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable

from sqlalchemy import distinct, exists, func, select
from sqlalchemy.orm import Session

from batchinfer.jobs import record_store
from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus
from batchinfer.db.session import retrying
from batchinfer.planner import PendingRequest, PlannerConfig, UnitPlan, plan_units, sized_for
from batchinfer.planner.fairness import service_levels
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, WorkerLoad, choose_queue, model_queue, route_units
from batchinfer.jobs.records import PreparedRequest, UnitRequest
from batchinfer.jobs.state import units


@dataclass(frozen=True)
class DispatchedUnit:
    unit_id: str
    queue: str
    num_requests: int
    level: int = 0  # service level, 0 runs first (the sender maps it onto the broker's priority steps)


def planner_config(ctx: AppContext) -> PlannerConfig:
    """The planner's settings; its block size is the one the workers' engines run with (engine_host.engine_config),
    so groups and expected cache hits fall on KV blocks. Read from the settings: no engine (torch) import here."""
    return PlannerConfig(max_requests_per_unit=ctx.settings.max_requests_per_unit,
                         max_tokens_per_unit=ctx.settings.max_tokens_per_unit, unit_growth=ctx.settings.unit_growth,
                         grouping=ctx.settings.prefix_grouping,
                         block_size=ctx.settings.kv_block_size)


UNITS_PER_COMMIT = 16
INPUT_WRITERS = 8  # unit inputs go up this many at once: each is a small PUT, mostly a round trip


def dispatch(ctx: AppContext, live_workers: list[str] | None = None, config: PlannerConfig | None = None,
             worker_loads: list[WorkerLoad] | None = None,
             on_units: Callable[[list[DispatchedUnit]], None] | None = None,
             max_units: int | None = None) -> list[DispatchedUnit]:
    """Plan every pending request into units, persist them (the first max_units of the plan only, when given:
    the rest stays pending for the next round), and return them in planner order.

    No lock is held across I/O: the plan is made from a snapshot, each unit's input is written to storage
    first, then its requests are claimed (FOR UPDATE SKIP LOCKED, still pending, job still runnable) and
    the units committed a batch at a time. A request another dispatcher or a cancel took meanwhile is
    skipped: a unit holds only the requests it claimed.

    A round (max_units) plans everything, so its units are the ones the whole plan runs first; a later round
    plans what is left again, and a prefix group cut by a round still groups then.

    With worker_loads (the registry's view), the whole plan is routed at once (route_units);
    otherwise each unit goes through choose_queue on the live worker names. on_units sees each batch of
    units as soon as it is committed (the caller sends them), so the first units run while the rest are
    still being written.
    """
    with ctx.sessions() as session:
        jobs = {job.id: job for job in session.scalars(
            select(Job).where(Job.status.in_(dispatched_states(ctx))).order_by(Job.created_at))}
        pending = _pending_indices(session, list(jobs))
        served = _served_units(session, list(jobs)) if pending else {}
    if not pending:
        return []
    prepared = _load_prepared(ctx, pending)
    requests = [_to_pending(prepared[job_id, index], jobs[job_id])
                for job_id, indices in pending.items() for index in sorted(indices) if (job_id, index) in prepared]
    plans, queues, models = [], [], []
    config = config or planner_config(ctx)
    for (model, growing), members in _by_model(requests, jobs).items():  # a unit never mixes models
        sized = sized_for(config, _backlog(members, growing), _workers_of(model, live_workers or [], worker_loads))
        model_plans = plan_units(members, sized)
        if growing:  # a group of a file still validated may grow: only units it cannot grow wait no longer
            model_plans = [p for p in model_plans if _full(p, sized)]
        plans += model_plans
        queues += _route(model_plans, model, live_workers or [], worker_loads)
        models += [model] * len(model_plans)
    levels = service_levels(plans, served, {j: job.priority for j, job in jobs.items()})
    planned = list(zip(plans, queues, levels, models))[:max_units]
    units = []
    with ThreadPoolExecutor(INPUT_WRITERS, thread_name_prefix="unit-input") as writers:
        for start in range(0, len(planned), UNITS_PER_COMMIT):
            batch = [(f"unit_{uuid.uuid4().hex}", *entry) for entry in planned[start:start + UNITS_PER_COMMIT]]
            list(writers.map(lambda entry: _write_input(ctx, entry[0], entry[1], prepared), batch))
            persisted = retrying(ctx.sessions, partial(_persist_units, batch=batch))
            if on_units is not None:
                on_units(persisted)
            units += persisted
    return units


def _to_pending(request: PreparedRequest, job: Job) -> PendingRequest:
    """As the planner takes it: the job's priority, queue time and cache scope, and the line's adapter (a line
    naming a model other than its batch's, the base, names one of the base's adapters)."""
    return request.to_pending(job.id, job.priority, job.queued_at or job.created_at, job.cache_scope, base=job.model)


def _persist_units(session: Session, batch: list[tuple[str, UnitPlan, str, int, str]]) -> list[DispatchedUnit]:
    held = units.plan_units(session, [(unit_id, plan, queue, model) for unit_id, plan, queue, _, model in batch])
    return [DispatchedUnit(unit_id, queue, held[unit_id], level) for unit_id, _, queue, level, _ in batch if unit_id in held]


def _write_input(ctx: AppContext, unit_id: str, plan: UnitPlan, prepared) -> None:
    requests = [UnitRequest(req.job_id, prepared[req.job_id, req.index], req.scope) for req in plan.requests]
    record_store.store_unit_input(ctx.storage, unit_id, requests)


def dispatched_states(ctx: AppContext) -> tuple[str, ...]:
    """Jobs a dispatch plans: runnable ones, and with streaming those still validating (the rows committed so far)."""
    return (JobStatus.VALIDATING, *JobStatus.RUNNABLE) if ctx.settings.stream_dispatch else tuple(JobStatus.RUNNABLE)


STREAM_UNIT_FILL = 0.75  # the planner evens out a group's units (1,000 requests: units of 55-60 of 64)


def _full(plan: UnitPlan, config: PlannerConfig) -> bool:
    """Big enough to send before its job's file ends: the part units a group's last rows would fill wait."""
    return (len(plan.requests) >= config.max_requests_per_unit * STREAM_UNIT_FILL
            or plan.cost >= config.max_tokens_per_unit * STREAM_UNIT_FILL)


def _backlog(members: list[PendingRequest], growing: bool) -> int:
    """What a group's units are sized by: its pending rows; for files still validated, the rows each has so far
    (its highest pending index + 1): a round of a file that is still growing sees only what the last rounds left,
    and base-size units of that would each pay a unit's fixed cost."""
    if not growing:
        return len(members)
    highest: dict[str, int] = {}
    for req in members:
        highest[req.job_id] = max(highest.get(req.job_id, -1), req.index)
    return sum(i + 1 for i in highest.values())  # a job's pending rows are at most its highest index + 1


def _by_model(requests: list[PendingRequest], jobs: dict[str, Job]) -> dict[tuple[str, bool], list[PendingRequest]]:
    """(model, still validating) -> its requests: a validating job is planned apart, its part units kept back."""
    found: dict[tuple[str, bool], list[PendingRequest]] = defaultdict(list)
    for req in requests:
        job = jobs[req.job_id]
        found[job.model, job.status == JobStatus.VALIDATING].append(req)
    return found


def _workers_of(model: str, live_workers: list[str], worker_loads: list[WorkerLoad] | None) -> int:
    """How many workers share the model's units."""
    return len(_serving(model, worker_loads)) if worker_loads else len(live_workers)


def _serving(model: str, worker_loads: list[WorkerLoad]) -> list[WorkerLoad]:
    """The model's workers; a worker that announced no model serves every model."""
    return [w for w in worker_loads if w.model in ("", model)]


def _route(plans: list[UnitPlan], model: str, live_workers: list[str], worker_loads: list[WorkerLoad] | None) -> list[str]:
    """Among the workers of the plans' model only (a worker that announced none counts for every model);
    what no worker's own queue gets goes to the model's queue, never to the shared one."""
    if worker_loads:
        mine = _serving(model, worker_loads)
        costs = [p.cost for p in plans]
        queues = route_units([(p.prefix_key, c) for p, c in zip(plans, costs)], mine,
                             adapters=[p.adapter for p in plans])
    else:
        queues = [choose_queue(p.prefix_key, live_workers) for p in plans]
    return [model_queue(model) if q == SHARED_QUEUE else q for q in queues]


def _served_units(session, job_ids: list[str]) -> dict[str, int]:
    """Units each job has received so far, across dispatch rounds (for least-attained-service priorities)."""
    rows = session.execute(select(Request.job_id, func.count(distinct(Request.unit_id)))
                           .where(Request.job_id.in_(job_ids), Request.unit_id.is_not(None)).group_by(Request.job_id))
    return {job_id: n for job_id, n in rows}


def _pending_indices(session, job_ids: list[str]) -> dict[str, set[int]]:
    pending: dict[str, set[int]] = defaultdict(set)
    if job_ids:
        rows = session.execute(select(Request.job_id, Request.index)
                               .where(Request.job_id.in_(job_ids), Request.status == RequestStatus.PENDING))
        for job_id, index in rows:
            pending[job_id].add(index)
    return pending


def _load_prepared(ctx: AppContext, pending: dict[str, set[int]]) -> dict[tuple[str, int], PreparedRequest]:
    """The pending requests of each job, from its prepared parts. A round holds every one it read until its units
    are written (~30,000 of ~600 tokens in a 200 MB batch): compact records, 4 bytes a token. A job with none stored
    yet (validated by an earlier version without streaming) waits for its queue move."""
    found: dict[tuple[str, int], PreparedRequest] = {}
    for job_id, indexes in pending.items():
        try:
            found.update(((job_id, i), req) for i, req in record_store.read_prepared(ctx.storage, job_id, indexes).items())
        except FileNotFoundError:
            continue
    return found


def more_pending(ctx: AppContext) -> bool:
    """Pending requests of a job a dispatch plans: what a further dispatch round would plan."""
    pending = exists().where(Request.job_id == Job.id, Request.status == RequestStatus.PENDING)
    with ctx.sessions() as session:
        return bool(session.scalar(select(exists().where(Job.status.in_(dispatched_states(ctx)), pending))))


def still_validating(ctx: AppContext) -> bool:
    """With streaming, some job a dispatch plans is still validated (its file may bring more full units)."""
    if not ctx.settings.stream_dispatch:
        return False
    with ctx.sessions() as session:
        return bool(session.scalar(select(exists().where(Job.status == JobStatus.VALIDATING))))
