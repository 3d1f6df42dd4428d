"""Moves of a job before it runs: create it, claim its validation, add its requests, then queue or fail it.

A validation run owns a `validating` job through a token; each batch of rows it commits renews the lease
(validation_heartbeat_at) and checks that it still owns the job, so a cancel or a newer run stops it.
"""
from __future__ import annotations

import time
import uuid

from sqlalchemy import delete, exists, func, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from batchinfer.context import AppContext
from batchinfer.db.models import IdempotencyKey, Job, JobStatus, Request, WorkUnit
from batchinfer.db.session import retrying, transaction
from batchinfer.errors import excerpt
from batchinfer.jobs import record_store
from batchinfer.jobs.state import table as T
from batchinfer.jobs.records import ValidationReport
from batchinfer.jobs.webhooks.events import record_final


class ValidationSuperseded(Exception):
    """This validation run no longer owns the job: it was cancelled, or another run took it over."""


def create_job(ctx: AppContext, idempotency_key: IdempotencyKey | None = None, **fields) -> Job:
    """A new job row in `validating` (fields: every other Job column), with the idempotency key it is made under in
    the same transaction (a concurrent create under that key fails here with IntegrityError)."""
    job = Job(status=T.CREATE_JOB.next_state, **fields)
    with transaction(ctx.sessions) as session:
        session.add(job)
        if idempotency_key is not None:
            session.add(idempotency_key)
    return job


def claim_validation(ctx: AppContext, job_id: str) -> str | None:
    """The token of the run that now owns the validation, or None when the job no longer validates.
    A rerun after a crash drops what the crashed run inserted."""
    token = uuid.uuid4().hex

    def work(session) -> int:
        claimed = session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING)
                                  .values(validation_token=token, validation_heartbeat_at=time.time())).rowcount
        if claimed:
            drop_requests(session, job_id)
        return claimed

    return token if retrying(ctx.sessions, work) else None


def drop_requests(session, job_id: str) -> None:
    """Drop a `validating` job's requests and zero its counts, in the caller's transaction: with streaming, units
    may have run some of them already (their commits added to the counts under the job row's lock, which the
    caller's UPDATE or delete waits for), and none of it may count (a unit's result is read only through a row)."""
    session.execute(delete(Request).where(Request.job_id == job_id))
    session.execute(update(Job).where(Job.id == job_id).values(
        completed=0, failed=0, prompt_tokens=0, completion_tokens=0, cached_tokens=0))


def add_requests(ctx: AppContext, job_id: str, token: str, rows: list[dict], model: str = "") -> None:
    """Insert a batch of valid lines as `pending` requests (one short transaction under the job row's lock),
    only while this run owns the job; `rows` is emptied. The job's model is set with its first rows (a dispatch
    of a job still validating groups and routes by it)."""
    def work(session) -> None:
        job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
        if job is None or job.status != JobStatus.VALIDATING or job.validation_token != token:
            raise ValidationSuperseded(job_id)
        if rows:
            _insert(session, rows)
        if model and job.model != model:
            job.model = model
        job.validation_heartbeat_at = time.time()

    retrying(ctx.sessions, work)
    rows.clear()


COPY_COLUMNS = ("job_id", "index", "line", "custom_id")


def _insert(session, rows: list[dict]) -> None:
    """New `pending` rows in this transaction. PostgreSQL: one COPY (an insert of the ORM is a statement a row,
    pipelined); the other columns take their server defaults. Elsewhere (SQLite) an insert of the ORM."""
    status = T.ADD_REQUEST.next_state
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(Request), [{**row, "status": status} for row in rows])
        return
    import psycopg  # lazy: psycopg, PostgreSQL's only

    sql = f"COPY requests ({', '.join(COPY_COLUMNS)}, status) FROM STDIN"
    driver = session.connection().connection.driver_connection  # psycopg's, in this session's transaction
    try:
        with driver.cursor() as cursor, cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row((*(row[c] for c in COPY_COLUMNS), status))
    except psycopg.Error as exc:  # as SQLAlchemy's own errors: a lost connection is a fault that passes (retried)
        raise DBAPIError.instance(sql, None, exc, psycopg.Error, connection_invalidated=driver.broken) from exc


ANALYZE_AFTER_ROWS = 1000  # a job this big changes the requests table's shape: its statistics are renewed


def refresh_statistics(ctx: AppContext, rows: int) -> None:
    """PostgreSQL plans every later move of a job's rows on the table's statistics; just after a bulk insert they
    still describe the table without them (autovacuum renews them a minute later at best, never where it is off),
    and plans made on them scanned the whole table for each unit planned (quadratic in the job's size)."""
    if rows < ANALYZE_AFTER_ROWS:
        return
    with ctx.sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("ANALYZE requests"))
            session.commit()


def finish_validation(ctx: AppContext, job_id: str, token: str, report: ValidationReport, runs: bool) -> Job:
    """Queue the job (`runs`) or fail it with its bad lines as its error file. A job cancelled meanwhile
    keeps none of its requests; a job another run owns now is left to that run."""
    now = time.time()
    with transaction(ctx.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
        if job.status != JobStatus.VALIDATING:
            session.execute(delete(Request).where(Request.job_id == job_id))  # the cancel zeroed its counts
            return job
        if job.validation_token != token:
            return job
        job.validation_token = None
        job.model = report.model or job.model
        job.errors = [e.to_dict() for e in report.errors]
        job.error_count = report.error_count
        job.total = report.lines
        job.invalid = report.lines - report.valid
        if runs:
            job.failed = job.failed + job.invalid  # added: streamed units may have counted some already
            T.apply(job, T.QUEUE_JOB, now)
            if _started(session, job_id):  # streamed: some unit ran or runs it, as START_JOB would have said
                T.apply(job, T.START_JOB, now)
        else:
            T.apply(job, T.FAIL_VALIDATION, now)
            job.error_key = record_store.job_invalid(job_id)  # its bad lines are its error file (API and CLI alike)
            session.flush()
            drop_requests(session, job_id)  # nothing of a failed job runs, nor counts (streamed units' results)
            session.refresh(job)
            job.failed = job.invalid  # what the API showed before streaming: the invalid lines, as failed
            record_final(session, job, now)
    return job


def _started(session, job_id: str) -> bool:
    """Some request of the job is in a unit that started (a streamed unit ran before the queue move)."""
    running = exists().where(Request.job_id == job_id, Request.unit_id == WorkUnit.id, WorkUnit.started_at.is_not(None))
    return bool(session.scalar(select(running)))


def fail_validation(ctx: AppContext, job_id: str, message: str, code: str = "server_error", param: str | None = None) -> None:
    """A `validating` job that can never run fails with `message` (bounded) as its one error."""
    error = {"code": code, "line": None, "param": param, "message": excerpt(message)}

    def work(session) -> None:
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update())  # job rows first, as a commit
        if T.move(session, T.FAIL_VALIDATION, Job.id == job_id, now=time.time(), error_count=1, errors=[error]):
            drop_requests(session, job_id)  # nothing of a failed job runs, nor counts
            record_final(session, session.get(Job, job_id, populate_existing=True))

    retrying(ctx.sessions, work)


def take_over_stale(ctx: AppContext, job_id: str, stale: float, now: float) -> bool:
    """Renew the lease of a validation that made no progress since `stale`; True for the one caller that
    did (two overlapping sweeps hand the job on once)."""
    last_progress = func.coalesce(Job.validation_heartbeat_at, Job.created_at)

    def work(session) -> int:
        return session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING,
                                                 last_progress < stale).values(validation_heartbeat_at=now)).rowcount

    return bool(retrying(ctx.sessions, work))


def validation_lost(ctx: AppContext, job_id: str) -> None:
    """The message that would validate this job could not be sent (the broker is down): the next sweep
    validates it, rather than after validation_stale_s."""
    retrying(ctx.sessions, lambda session: session.execute(
        update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING).values(validation_heartbeat_at=0.0)))
