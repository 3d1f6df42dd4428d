"""Moves that end a job: cancel, expire, close what nothing runs any more, and the moves of its finalize (claim
it, end it once its files are assembled, or retry it later; the finalize stage drives them).

Each is idempotent and safe from many processes at once: a conditional UPDATE decides who makes it.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import retrying, transaction
from batchinfer.error_codes import batch_not_found, cannot_cancel
from batchinfer.errors import JobConflict, JobNotFound, shown
from batchinfer.jobs.state import table as T
from batchinfer.jobs.state.intake import drop_requests
from batchinfer.jobs.webhooks.events import record_final

log = logging.getLogger(__name__)
FINALIZE_LEASE_S = 300.0  # a finalize that crashed midway is taken over after this long
FINALIZE_MAX_ATTEMPTS = 12
FINALIZE_BACKOFF_S = (2.0, 600.0)  # first retry after 2 s, doubling, at most 10 minutes apart


def cancel(ctx: AppContext, job_id: str, now: float, visible: Callable[[Job], bool] = lambda job: True) -> None:
    """Stop what has not started (a validation stops at its next batch, and none of its requests count);
    everything finished so far is kept. `visible` scopes the call to the jobs a caller may see."""
    with transaction(ctx.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or not visible(job):
            raise JobNotFound(batch_not_found(shown(job_id)))
        if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):  # as OpenAI: cancelling again answers as it is
            return
        if not T.CANCEL_JOB.allows(job.status):
            raise JobConflict(cannot_cancel(job.status))
        if job.status == JobStatus.VALIDATING:  # none of it counts, also what streamed units ran
            drop_requests(session, job_id)
            session.refresh(job)
            job.validation_token = None
        T.apply(job, T.CANCEL_JOB, now)
        close_unstarted(session, job_id, T.CANCEL_UNSTARTED)


def close_unstarted(session, job_id: str, t: T.Transition) -> int:
    """Unstarted requests of a job move by `t` (cancel, expire); the job counts them as failed."""
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
    moved = T.move(session, t, Request.job_id == job_id)
    session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + moved))
    return moved


def expire_overdue(ctx: AppContext, now: float) -> list[str]:
    """Jobs past their completion window: unstarted requests expire (finished ones are kept); returns them,
    for the caller to finalize."""
    def work(session) -> list[str]:
        overdue = list(session.scalars(select(Job.id).where(Job.status.in_(JobStatus.RUNNABLE), Job.expires_at < now)
                                       .order_by(Job.id)))
        for job_id in overdue:
            close_unstarted(session, job_id, T.EXPIRE_UNSTARTED)
            _expire_orphaned(session, job_id)
        return overdue

    return retrying(ctx.sessions, work)


def _expire_orphaned(session, job_id: str) -> int:
    """Running requests of a unit that no longer runs (its worker was lost and the sweep queued it again): with
    no worker to start it (a fleet scaled to zero) nothing else would close them. A running unit's own watch
    expires its requests in the engine."""
    not_running = ~exists().where(WorkUnit.id == Request.unit_id, WorkUnit.status == UnitStatus.RUNNING)
    moved = T.move(session, T.EXPIRE_ORPHANED, Request.job_id == job_id, not_running)
    if moved:
        session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + moved))
    return moved


def close_cancelled(ctx: AppContext) -> int:
    """Requests of cancelling jobs left open by a unit that no longer runs (it was rerun or lost) are
    cancelled: nothing will run them again, and the job can then finish."""
    def work(session) -> int:
        jobs = list(session.scalars(select(Job.id).where(Job.status == JobStatus.CANCELLING).order_by(Job.id)
                                    .with_for_update()))
        closed = 0
        for job_id in jobs:
            not_running = ~exists().where(WorkUnit.id == Request.unit_id, WorkUnit.status == UnitStatus.RUNNING)
            moved = T.move(session, T.CANCEL_ORPHANED, Request.job_id == job_id, not_running)
            if moved:
                session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + moved))
                closed += moved
        return closed

    return retrying(ctx.sessions, work)


def claim_finalize(session, job_id: str, now: float) -> tuple[bool, int] | None:
    """(cancelled?, attempts) when this caller now owns the finalize, else None."""
    open_requests = exists().where(Request.job_id == job_id, Request.status.in_(RequestStatus.OPEN))
    lease = {"finalizing_at": now, "finalize_after": now + FINALIZE_LEASE_S, "finalize_attempts": Job.finalize_attempts + 1}
    first = T.statement(T.FINALIZE_JOB, Job.id == job_id, ~open_requests, **lease)
    retry = T.statement(T.RETRY_FINALIZE, Job.id == job_id, Job.finalize_after < now, **lease)
    for stmt in (first, retry):
        won = session.execute(stmt.returning(Job.cancelling_at, Job.finalize_attempts)).first()
        if won is not None:
            return won.cancelling_at is not None, won.finalize_attempts
    return None


def end_finalized(session: Session, job_id: str, claimed: tuple[bool, int], output_key: str,
                  error_key: str | None) -> None:
    """The job's files are assembled: it ends cancelled, expired or completed (a finalize this caller claimed)."""
    expired = session.scalar(select(exists().where(Request.job_id == job_id, Request.status == RequestStatus.EXPIRED)))
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or job.status != JobStatus.FINALIZING:  # a run that took over after this one's lease ended finished it
        return
    job.output_key, job.error_key, job.finalize_after = output_key, error_key, None
    cancelled, _ = claimed
    T.apply(job, T.END_CANCELLED if cancelled else T.EXPIRE_JOB if expired else T.COMPLETE_JOB, time.time())
    record_final(session, job)


def finalize_failed(session, job_id: str, claimed: tuple[bool, int], exc: Exception, outage_s: float | None = None) -> None:
    """outage_s: a service was down (not the job's fault): not counted, tried again that soon, never failed for it."""
    _, attempts = claimed
    cause = f"{type(exc).__name__}: {str(exc)[:300]}"
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or job.status != JobStatus.FINALIZING:
        return
    if outage_s is not None:
        job.finalize_attempts, job.finalize_after = attempts - 1, time.time() + outage_s
        log.warning("job %s: finalize waits for a service (%s); trying again in %.0f s", job_id, cause, outage_s)
        return
    if attempts >= FINALIZE_MAX_ATTEMPTS:
        log.error("job %s: finalize failed %d times, the job fails: %s", job_id, attempts, cause)
        T.apply(job, T.FAIL_FINALIZE, time.time())
        job.finalize_after = None
        job.errors = [*(job.errors or []), {"line": None, "code": "server_error", "param": None,
                                            "message": "could not assemble the results (storage kept failing)"}]
        record_final(session, job)
        return
    first, cap = FINALIZE_BACKOFF_S
    delay = min(first * 2 ** (attempts - 1), cap)
    job.finalize_after = time.time() + delay
    log.warning("job %s: finalize failed (%s); retry %d in %.0f s", job_id, cause, attempts, delay)


def forget_result_file(ctx: AppContext, job_id: str, errors: bool) -> bool:
    """Its owner deleted an ended job's output (or error) file: the job keeps the file's id, and reading the file
    says it is gone. True for the one call that marked it."""
    column = Job.error_deleted_at if errors else Job.output_deleted_at

    def work(session) -> int:
        return session.execute(update(Job).where(Job.id == job_id, column.is_(None), Job.status.in_(JobStatus.TERMINAL))
                               .values({column: time.time()})).rowcount

    return bool(retrying(ctx.sessions, work))
