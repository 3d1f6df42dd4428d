"""The job-state half of the periodic sweep: expire overdue jobs, finish cancels, finalize jobs with no open
request, and retry finalizes that failed. Every function is idempotent and safe to run from many processes:
a conditional UPDATE decides who does each step.

Lock order everywhere in the job system: job rows first, then request rows (no deadlock between them).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from sqlalchemy import exists, func, select, update

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import is_transient, retrying
from batchinfer.errors import excerpt, one_line
from batchinfer.jobs.assembly import assemble
from batchinfer.jobs.webhook_events import record_final

log = logging.getLogger(__name__)
FINALIZABLE = (JobStatus.QUEUED, JobStatus.IN_PROGRESS, JobStatus.CANCELLING)
FINALIZE_LEASE_S = 300.0  # a finalize that crashed midway is taken over after this long
FINALIZE_MAX_ATTEMPTS = 12
FINALIZE_BACKOFF_S = (2.0, 600.0)  # first retry after 2 s, doubling, at most 10 minutes apart


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
    swept.expired = expire_overdue(ctx, now)
    swept.cancelled_requests = close_cancelled(ctx)
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
            if revalidate_job(ctx, job_id) != JobStatus.VALIDATING:
                recovered.append(job_id)
        elif _renew_validation_lease(ctx, job_id, stale, now):
            log.warning("job %s: its validation stopped making progress; validating it again", job_id)
            revalidate(job_id)
            recovered.append(job_id)
    return recovered


def validation_lost(ctx: AppContext, job_id: str) -> None:
    """The message that would validate this job could not be sent (the broker is down): the next sweep
    validates it, rather than after validation_stale_s."""
    retrying(ctx.sessions, lambda session: session.execute(
        update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING).values(validation_heartbeat_at=0.0)))


def _renew_validation_lease(ctx: AppContext, job_id: str, stale: float, now: float) -> bool:
    """True for the one sweep that takes the job over (two overlapping sweeps hand it on once)."""
    last_progress = func.coalesce(Job.validation_heartbeat_at, Job.created_at)

    def work(session) -> int:
        return session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING,
                                                 last_progress < stale).values(validation_heartbeat_at=now)).rowcount

    return bool(retrying(ctx.sessions, work))


def revalidate_job(ctx: AppContext, job_id: str) -> str:
    """Validate a job whose first validation may be lost; returns its status after. A fault that may pass
    (database or storage unreachable) leaves it `validating` for the next sweep; any other failure fails
    the job, naming the cause, rather than retrying it forever."""
    from batchinfer.jobs.service import validate_job  # the service builds on this module

    try:
        return validate_job(ctx, job_id).status
    except Exception as exc:
        try:
            return _validation_failed(ctx, job_id, exc)
        except Exception as again:  # the database or storage went away meanwhile: the next sweep tries again
            log.warning("revalidating %s failed, will retry: %s", job_id, one_line(again))
            return JobStatus.VALIDATING


def _validation_failed(ctx: AppContext, job_id: str, exc: Exception) -> str:
    if _passes(exc):
        log.warning("revalidating %s failed, will retry: %s", job_id, one_line(exc))
        return JobStatus.VALIDATING
    if isinstance(exc, FileNotFoundError) and not _input_stored(ctx, job_id):
        cause = "the input file was never stored (the submit was interrupted)"
    else:
        cause = f"validation failed: {type(exc).__name__}: {excerpt(str(exc))}"
    log.warning("job %s fails: %s", job_id, cause)
    fail_validation(ctx, job_id, cause)
    return JobStatus.FAILED


def _input_stored(ctx: AppContext, job_id: str) -> bool:
    with ctx.sessions() as session:
        key = session.scalar(select(Job.input_key).where(Job.id == job_id))
    return key is not None and ctx.storage.exists(key)


def _passes(exc: BaseException) -> bool:
    """The database or storage unreachable for now (a missing file is not that)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return is_transient(exc) or isinstance(exc, (BotoCoreError, ClientError, ConnectionError, TimeoutError))


def fail_validation(ctx: AppContext, job_id: str, message: str) -> None:
    """A `validating` job that can never run fails with `message` (bounded) as its one error."""
    message = excerpt(message)

    def work(session) -> None:
        failed = session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING).values(
            status=JobStatus.FAILED, failed_at=time.time(), error_count=1,
            errors=[{"code": "server_error", "line": None, "param": None, "message": message}]))
        if failed.rowcount:
            record_final(session, session.get(Job, job_id, populate_existing=True))

    retrying(ctx.sessions, work)


def close_unstarted(session, job_id: str, status: str) -> int:
    """Unstarted requests of a job become `status` (cancelled, expired); the job counts them as failed."""
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
    result = session.execute(update(Request).where(Request.job_id == job_id,
                                                   Request.status.in_(RequestStatus.UNSTARTED)).values(status=status))
    session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + result.rowcount))
    return result.rowcount


def expire_overdue(ctx: AppContext, now: float | None = None) -> list[str]:
    """Jobs past their completion window: unstarted requests become batch_expired, finished ones are kept."""
    now = now or time.time()

    def work(session) -> list[str]:
        overdue = list(session.scalars(select(Job.id).where(Job.status.in_(JobStatus.RUNNABLE), Job.expires_at < now)
                                       .order_by(Job.id)))
        for job_id in overdue:
            close_unstarted(session, job_id, RequestStatus.EXPIRED)
        return overdue

    overdue = retrying(ctx.sessions, work)
    for job_id in overdue:
        try_finalize(ctx, job_id)
    return overdue


def close_cancelled(ctx: AppContext) -> int:
    """Requests of cancelling jobs left `running` by a unit that no longer runs (it was rerun or lost)
    become cancelled: nothing will run them again, and the job can then finish."""
    def work(session) -> int:
        jobs = list(session.scalars(select(Job.id).where(Job.status == JobStatus.CANCELLING).order_by(Job.id)
                                    .with_for_update()))
        closed = 0
        for job_id in jobs:
            not_running = ~exists().where(WorkUnit.id == Request.unit_id, WorkUnit.status == UnitStatus.RUNNING)
            result = session.execute(update(Request).where(Request.job_id == job_id, Request.status.in_(
                RequestStatus.OPEN), not_running).values(status=RequestStatus.CANCELLED)
                .execution_options(synchronize_session=False))
            if result.rowcount:
                session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + result.rowcount))
                closed += result.rowcount
        return closed

    return retrying(ctx.sessions, work)


def _finalizable(ctx: AppContext) -> list[str]:
    open_requests = exists().where(Request.job_id == Job.id, Request.status.in_(RequestStatus.OPEN))
    with ctx.sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.status.in_(FINALIZABLE), ~open_requests)))


def _finalize_retries(ctx: AppContext, now: float) -> list[str]:
    with ctx.sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.status == JobStatus.FINALIZING,
                                                         Job.finalize_after < now)))


def try_finalize(ctx: AppContext, job_id: str) -> bool:
    """Assemble the files once no request is open. A conditional UPDATE lets one caller at a time do it; a
    finalize that fails (storage down) is retried by the sweep with backoff, and fails the job at the end."""
    now = time.time()
    claimed = retrying(ctx.sessions, lambda session: _claim_finalize(session, job_id, now))
    if claimed is None:
        return False
    try:
        retrying(ctx.sessions, lambda session: _assemble(ctx, session, job_id, claimed))
        return True
    except Exception as exc:  # storage or database still failing after retries: try again later
        retrying(ctx.sessions, partial(_finalize_failed, job_id=job_id, claimed=claimed, exc=exc))
        return False


def _claim_finalize(session, job_id: str, now: float) -> tuple[bool, int] | None:
    """(cancelled?, attempts) when this caller now owns the finalize, else None."""
    open_requests = exists().where(Request.job_id == job_id, Request.status.in_(RequestStatus.OPEN))
    first = ((Job.status.in_(FINALIZABLE)) & ~open_requests)
    retry = (Job.status == JobStatus.FINALIZING) & (Job.finalize_after < now)
    won = session.execute(update(Job).where(Job.id == job_id, first | retry)
                          .values(status=JobStatus.FINALIZING, finalizing_at=now, finalize_after=now + FINALIZE_LEASE_S,
                                  finalize_attempts=Job.finalize_attempts + 1)
                          .returning(Job.cancelling_at, Job.finalize_attempts)).first()
    return None if won is None else (won.cancelling_at is not None, won.finalize_attempts)


def _assemble(ctx: AppContext, session, job_id: str, claimed: tuple[bool, int]) -> None:
    output_key, error_key = assemble(session, ctx.storage, job_id)
    expired = session.scalar(select(exists().where(Request.job_id == job_id, Request.status == RequestStatus.EXPIRED)))
    job = session.get(Job, job_id)
    job.output_key, job.error_key, job.finalize_after = output_key, error_key, None
    cancelled, _ = claimed
    now = time.time()
    if cancelled:
        job.status, job.cancelled_at = JobStatus.CANCELLED, now
    elif expired:
        job.status, job.expired_at = JobStatus.EXPIRED, now
    else:
        job.status, job.completed_at = JobStatus.COMPLETED, now
    record_final(session, job)


def _finalize_failed(session, job_id: str, claimed: tuple[bool, int], exc: Exception) -> None:
    _, attempts = claimed
    cause = f"{type(exc).__name__}: {str(exc)[:300]}"
    job = session.get(Job, job_id, with_for_update=True)
    if attempts >= FINALIZE_MAX_ATTEMPTS:
        log.error("job %s: finalize failed %d times, the job fails: %s", job_id, attempts, cause)
        job.status, job.failed_at, job.finalize_after = JobStatus.FAILED, time.time(), None
        job.errors = [*(job.errors or []), {"line": None, "code": "server_error", "param": None,
                                            "message": f"could not assemble the results: {cause}"}]
        record_final(session, job)
        return
    first, cap = FINALIZE_BACKOFF_S
    delay = min(first * 2 ** (attempts - 1), cap)
    job.finalize_after = time.time() + delay
    log.warning("job %s: finalize failed (%s); retry %d in %.0f s", job_id, cause, attempts, delay)
