"""The job-state half of the periodic sweep: validate again what stopped validating, expire overdue jobs, finish
cancels, finalize jobs with no open request, and retry finalizes that failed. Every step is a move of
jobs.state, idempotent and safe to run from many processes (a conditional UPDATE decides who does it).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import exists, func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus
from batchinfer.jobs.intake.validate_job import ValidationDeferred, deferred_cause, validate_job
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import ending, table
from batchinfer.jobs.state.intake import take_over_stale

log = logging.getLogger(__name__)


@dataclass
class JobSweep:
    expired: list[str] = field(default_factory=list)
    cancelled_requests: int = 0
    finalized: list[str] = field(default_factory=list)
    revalidated: list[str] = field(default_factory=list)


def sweep_jobs(ctx: AppContext, now: float | None = None, revalidate: Callable[[str], object] | None = None) -> JobSweep:
    """One pass over every job that may need a step without anyone asking for it. `revalidate` hands a
    stale validation to a worker's task queue (the tick stays short); without it, it runs here."""
    now = now or time.time()
    swept = JobSweep()
    swept.revalidated = recover_validating(ctx, now, revalidate)
    swept.expired = ending.expire_overdue(ctx, now)
    for job_id in swept.expired:
        try_finalize(ctx, job_id)
    swept.cancelled_requests = ending.close_cancelled(ctx)
    for job_id in _finalizable(ctx) + _finalize_retries(ctx, now):
        if try_finalize(ctx, job_id):
            swept.finalized.append(job_id)
    return swept


def recover_validating(ctx: AppContext, now: float, revalidate: Callable[[str], object] | None = None) -> list[str]:
    """Batches stuck in `validating` (a submit that crashed, a validation message lost) are validated again,
    from the start; validation is idempotent, so a slow one that is still going only repeats work. A job
    handed to `revalidate` has its lease renewed first, so no sweep hands it on again for validation_stale_s."""
    stale = now - ctx.settings.validation_stale_s
    last_progress = func.coalesce(Job.validation_heartbeat_at, Job.created_at)
    with ctx.sessions() as session:
        job_ids = list(session.scalars(select(Job.id).where(Job.status == JobStatus.VALIDATING, last_progress < stale)
                                       .order_by(Job.created_at).limit(10)))
    recovered = []
    for job_id in job_ids:
        if revalidate is None:
            if _validate_here(ctx, job_id):
                recovered.append(job_id)
        elif take_over_stale(ctx, job_id, stale, now):
            log.warning("job %s: its validation stopped making progress; validating it again", job_id)
            revalidate(job_id)
            recovered.append(job_id)
    return recovered


def _validate_here(ctx: AppContext, job_id: str) -> bool:
    """Validate a stale job in this process; True once it left `validating`."""
    try:
        return validate_job(ctx, job_id).status != JobStatus.VALIDATING
    except ValidationDeferred as exc:
        log.warning("%s (%s)", exc, deferred_cause(exc))
        return False


def _finalizable(ctx: AppContext) -> list[str]:
    open_requests = exists().where(Request.job_id == Job.id, Request.status.in_(RequestStatus.OPEN))
    with ctx.sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.status.in_(table.FINALIZE_JOB.current_states), ~open_requests)))


def _finalize_retries(ctx: AppContext, now: float) -> list[str]:
    with ctx.sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.status.in_(table.RETRY_FINALIZE.current_states),
                                                         Job.finalize_after < now)))
