"""Cut the pending requests of all queued jobs into work units and say where each unit should run.

Units may mix requests of several jobs (the planner groups shared prefixes across jobs). The caller
enqueues the returned units (Celery) or runs them in-process (embedded).
"""
from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass

from sqlalchemy import bindparam, select, update

from batchinfer import keys
from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.planner import PendingRequest, PlannerConfig, UnitPlan, plan_units
from batchinfer.routing import choose_queue
from batchinfer.validation import PreparedRequest


@dataclass(frozen=True)
class DispatchedUnit:
    unit_id: str
    queue: str
    num_requests: int


def planner_config(ctx: AppContext) -> PlannerConfig:
    return PlannerConfig(max_requests_per_unit=ctx.settings.max_requests_per_unit,
                         max_tokens_per_unit=ctx.settings.max_tokens_per_unit)


def dispatch(ctx: AppContext, live_workers: list[str] | None = None,
             config: PlannerConfig | None = None) -> list[DispatchedUnit]:
    """Plan every pending request into units, persist them, and return them in planner order."""
    with transaction(ctx.sessions) as session:
        jobs = {job.id: job for job in session.scalars(
            select(Job).where(Job.status.in_(JobStatus.RUNNABLE)).order_by(Job.created_at).with_for_update())}
        pending = _pending_indices(session, list(jobs))
        if not pending:
            return []
        prepared = _load_prepared(ctx, pending)
        requests = [PendingRequest(job_id, index, tuple(prepared[job_id, index].prompt_token_ids),
                                   prepared[job_id, index].sampling["max_tokens"], jobs[job_id].priority,
                                   jobs[job_id].queued_at or jobs[job_id].created_at)
                    for job_id, indices in pending.items() for index in sorted(indices)]
        plans = plan_units(requests, config or planner_config(ctx))
        return [_persist_unit(ctx, session, plan, prepared, live_workers or []) for plan in plans]


def _pending_indices(session, job_ids: list[str]) -> dict[str, set[int]]:
    pending: dict[str, set[int]] = defaultdict(set)
    if job_ids:
        rows = session.execute(select(Request.job_id, Request.index)
                               .where(Request.job_id.in_(job_ids), Request.status == RequestStatus.PENDING))
        for job_id, index in rows:
            pending[job_id].add(index)
    return pending


def _load_prepared(ctx: AppContext, pending: dict[str, set[int]]) -> dict[tuple[str, int], PreparedRequest]:
    """Stream each job's prepared file, keeping only the pending requests."""
    found = {}
    for job_id, indices in pending.items():
        with ctx.storage.open_read(keys.job_prepared(job_id)) as stream:
            for raw in stream:
                req = PreparedRequest.from_json(raw)
                if req.index in indices:
                    found[job_id, req.index] = req
    return found


def _persist_unit(ctx: AppContext, session, plan: UnitPlan, prepared, live_workers: list[str]) -> DispatchedUnit:
    unit_id = f"unit_{uuid.uuid4().hex}"
    queue = choose_queue(plan.prefix_key, live_workers)
    with ctx.storage.open_write(keys.unit_input(unit_id)) as out:
        for req in plan.requests:
            out.write(json.dumps({"job_id": req.job_id, **asdict(prepared[req.job_id, req.index])}).encode() + b"\n")
    session.add(WorkUnit(id=unit_id, status=UnitStatus.QUEUED, queue=queue, prefix_key=plan.prefix_key,
                         shared_prefix_len=plan.shared_prefix_len, num_requests=len(plan.requests),
                         input_key=keys.unit_input(unit_id), created_at=time.time()))
    session.flush()
    stmt = (update(Request).where(Request.job_id == bindparam("j"), Request.index == bindparam("i"))
            .values(status=RequestStatus.PLANNED, unit_id=unit_id, unit_pos=bindparam("p")))
    session.connection().execute(stmt, [{"j": r.job_id, "i": r.index, "p": pos} for pos, r in enumerate(plan.requests)])
    return DispatchedUnit(unit_id, queue, len(plan.requests))
