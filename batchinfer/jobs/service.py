"""The job service: submit, status, list, cancel and download batch jobs (periodic steps: jobs.lifecycle)."""
from __future__ import annotations

import time
import uuid
from typing import BinaryIO

from sqlalchemy import delete, insert, select, update

from batchinfer.jobs import formats, keys, scopes, webhook_events
from batchinfer.jobs.lifecycle import close_unstarted, fail_validation, try_finalize
from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus
from batchinfer.db.session import retrying, transaction
from batchinfer.jobs.tokenizer import tokenizer_and_context
from batchinfer.errors import BatchInferError, InvalidRequest, JobConflict, JobNotFound, excerpt, one_line, shown
from batchinfer.settings import Settings, parse_duration
from batchinfer.jobs.webhook_target import check_url
from batchinfer.jobs.validation import LineError, PreparedRequest, ValidationLimits, ValidationReport, validate_stream

INSERT_BATCH = 1000
BEAT_S = 5.0  # a validation renews its lease at least this often, also through a long run of invalid lines


def new_job_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def submit(ctx: AppContext, source: BinaryIO, filename: str = "", model: str | None = None,
           metadata: dict | None = None, completion_window: str | None = None, skip_invalid: bool = False,
           priority: int = 0, now: float | None = None) -> Job:
    """Store the input, validate it line by line, and queue the job (or fail it with every error listed)."""
    job = create_job(ctx, source=source, filename=filename, model=model, metadata=metadata,
                     completion_window=completion_window, skip_invalid=skip_invalid, priority=priority, now=now)
    try:
        return validate_job(ctx, job.id)
    except KeyboardInterrupt:  # whoever submitted stopped it: it ends now, rather than run after the sweep finds it
        cancel(ctx, job.id)
        raise KeyboardInterrupt(f"job {job.id} cancelled before its validation ended") from None
    except BatchInferError:
        raise
    except Exception as exc:  # storage or the database went away mid-file: the job is kept, the sweep resumes it
        raise BatchInferError(f"job {job.id} is stored, but its validation stopped ({one_line(exc)}); it is "
                              f"validated again once {ctx.settings.validation_stale_s:g} s pass with storage and "
                              "the database back") from None


def create_job(ctx: AppContext, *, source: BinaryIO | None = None, input_key: str | None = None, filename: str = "",
               model: str | None = None, metadata: dict | None = None, completion_window: str | None = None,
               skip_invalid: bool = False, priority: int = 0, now: float | None = None, **fields) -> Job:
    """A job row in `validating`. Its input is `input_key` when already stored (an uploaded file, not copied),
    else `source`, streamed to the job's own input key. `fields` are further Job columns (owner_id, ...).
    If storing `source` fails, the job is failed at once naming the cause, and the error is raised."""
    settings = ctx.settings
    model = model or settings.model_id
    if model != settings.model_id:
        raise InvalidRequest(f"model_not_found: model {shown(model)} is not served here (use {settings.model_id!r})")
    try:
        window = parse_duration(completion_window or settings.completion_window, settings.max_completion_window_s)
    except ValueError as exc:
        raise InvalidRequest(f"invalid_completion_window: {exc}") from None
    webhook_url = (metadata or {}).get(webhook_events.METADATA_KEY)
    if webhook_url:
        check_url(webhook_url, settings.webhook_allow_private)
    fields["cache_scope"] = scopes.job_scope(ctx, fields.get("owner_id"))
    now = now or time.time()
    job_id = new_job_id()
    job = Job(id=job_id, status=JobStatus.VALIDATING, model=model, input_filename=filename,
              metadata_=dict(metadata or {}), skip_invalid=skip_invalid, priority=priority,
              completion_window_s=window, created_at=now, expires_at=now + window,
              input_key=input_key or keys.job_input(job_id), errors=[], **fields)
    with transaction(ctx.sessions) as session:
        session.add(job)
    if source is not None:
        _store_input(ctx, job, source)
    return job


def _input_key(job: Job) -> str:
    """The job's input: the key create_job set (the column is nullable), else the default one."""
    return job.input_key or keys.job_input(job.id)


def _store_input(ctx: AppContext, job: Job, source: BinaryIO) -> None:
    try:
        ctx.storage.upload(_input_key(job), source)
    except Exception as exc:  # storage down: the job can never run, so it ends now rather than at the sweep
        cause = f"could not store the input file: {type(exc).__name__}: {excerpt(str(exc))}"
        try:
            fail_validation(ctx, job.id, cause)
        except Exception:  # the database is down too: the sweep fails it once validation_stale_s has passed
            pass
        raise BatchInferError(f"job {job.id}: {cause}") from exc


class ValidationSuperseded(Exception):
    """This validation run no longer owns the job: it was cancelled, or another run took it over."""


def validate_job(ctx: AppContext, job_id: str) -> Job:
    """Validate a `validating` job's stored input and move it on to queued or failed; returns the job.
    Idempotent and resumable: each run claims the job and starts clean (a crashed run's request rows are
    dropped), request rows are committed in batches, and a run that lost its claim stops. A cancel that
    lands meanwhile wins: the job ends cancelled and is never set back to queued."""
    token = _claim_validation(ctx, job_id)
    if token is None:
        return get(ctx, job_id)
    try:
        report = _validate(ctx, get(ctx, job_id), token)
    except ValidationSuperseded:
        return get(ctx, job_id)
    return _after_validation(ctx, job_id, token, report)


def _claim_validation(ctx: AppContext, job_id: str) -> str | None:
    token = uuid.uuid4().hex

    def work(session) -> int:
        claimed = session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING)
                                  .values(validation_token=token, validation_heartbeat_at=time.time())).rowcount
        if claimed:  # a rerun after a crash drops what the crashed run inserted
            session.execute(delete(Request).where(Request.job_id == job_id))
        return claimed

    return token if retrying(ctx.sessions, work) else None


def _commit_requests(ctx: AppContext, job_id: str, token: str, rows: list[dict]) -> None:
    """One short transaction per batch of rows, under the job row's lock, only while this run owns the job."""
    def work(session) -> None:
        job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
        if job is None or job.status != JobStatus.VALIDATING or job.validation_token != token:
            raise ValidationSuperseded(job_id)
        if rows:
            session.execute(insert(Request), rows)
        job.validation_heartbeat_at = time.time()

    retrying(ctx.sessions, work)
    rows.clear()


def validation_limits(s: Settings, max_model_len: int) -> ValidationLimits:
    return ValidationLimits(model_id=s.model_id, max_model_len=max_model_len, max_requests=s.max_requests_per_file,
                            max_line_bytes=s.max_line_bytes, max_file_bytes=s.max_file_bytes,
                            default_max_tokens=s.default_max_tokens, max_errors_kept=s.max_errors_kept)


def _validate(ctx: AppContext, job: Job, token: str) -> ValidationReport:
    """Stream the stored input; valid lines go to prepared.jsonl and the requests table, bad ones to invalid.jsonl."""
    tokenizer, max_model_len = tokenizer_and_context(ctx.settings)
    rows: list[dict] = []
    beat_at = time.monotonic()

    def commit_when_due() -> None:  # each commit renews the lease and notices a cancel
        nonlocal beat_at
        if len(rows) >= INSERT_BATCH or time.monotonic() - beat_at >= BEAT_S:
            _commit_requests(ctx, job.id, token, rows)
            beat_at = time.monotonic()

    with (ctx.storage.open_read(_input_key(job)) as source,
          ctx.storage.open_write(keys.job_prepared(job.id)) as prepared,
          ctx.storage.open_write(keys.job_invalid(job.id)) as invalid):
        def on_valid(req: PreparedRequest) -> None:
            prepared.write(req.to_json().encode() + b"\n")
            rows.append({"job_id": job.id, "index": req.index, "line": req.line, "custom_id": req.custom_id,
                         "status": RequestStatus.PENDING})
            commit_when_due()

        def on_invalid(error: LineError) -> None:
            invalid.write(formats.dumps(formats.error_line(job.id, None, error.custom_id, error.code,
                                                           error.message, error.line, error.param)))
            commit_when_due()

        report = validate_stream(source, tokenizer, validation_limits(ctx.settings, max_model_len), on_valid, on_invalid)
        _commit_requests(ctx, job.id, token, rows)  # also the last check that this run still owns the job
    return report


def _runs(job: Job, report: ValidationReport) -> bool:
    return report.valid > 0 and (report.ok or (job.skip_invalid and not report.file_error))


def _after_validation(ctx: AppContext, job_id: str, token: str, report: ValidationReport) -> Job:
    now = time.time()
    with transaction(ctx.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job.status != JobStatus.VALIDATING:  # cancelled while it validated: nothing of it runs
            session.execute(delete(Request).where(Request.job_id == job_id))
            return job
        if job.validation_token != token:  # another run owns it now and decides
            return job
        job.validation_token = None
        job.errors = [e.to_dict() for e in report.errors]
        job.error_count = report.error_count
        job.total = report.lines
        job.invalid = job.failed = report.lines - report.valid
        if _runs(job, report):
            job.status, job.queued_at = JobStatus.QUEUED, now
        else:
            job.status, job.failed_at = JobStatus.FAILED, now
            job.error_key = keys.job_invalid(job_id)  # its bad lines are its error file (API and CLI alike)
            session.execute(delete(Request).where(Request.job_id == job_id))  # nothing of a failed job runs
            webhook_events.record_final(session, job, now)
    return job


# `owner` scopes a call to one tenant: another tenant's job answers exactly as a missing one.
ANY_OWNER = object()


def get(ctx: AppContext, job_id: str, owner=ANY_OWNER) -> Job:
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    if job is None or (owner is not ANY_OWNER and job.owner_id != owner):
        raise JobNotFound(f"no job {job_id!r}")
    return job


def list_jobs(ctx: AppContext, limit: int = 50, owner=ANY_OWNER, after: str | None = None) -> list[Job]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if owner is not ANY_OWNER:
        query = query.where(Job.owner_id == owner)
    with ctx.sessions() as session:
        if after is not None:
            anchor = session.get(Job, after)
            if anchor is None or (owner is not ANY_OWNER and anchor.owner_id != owner):
                return []
            query = query.where((Job.created_at < anchor.created_at)
                                | ((Job.created_at == anchor.created_at) & (Job.id < anchor.id)))
        return list(session.scalars(query))


def cancel(ctx: AppContext, job_id: str, now: float | None = None, owner=ANY_OWNER) -> Job:
    """Stop what has not started; everything finished so far is kept in the output."""
    now = now or time.time()
    with transaction(ctx.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or (owner is not ANY_OWNER and job.owner_id != owner):
            raise JobNotFound(f"no job {job_id!r}")
        if job.status in JobStatus.TERMINAL or job.status == JobStatus.CANCELLING:
            raise JobConflict(f"job {job_id} is already {job.status}")
        if job.status == JobStatus.VALIDATING:  # its validation stops at its next batch; no request of it counts
            session.execute(delete(Request).where(Request.job_id == job_id))
            job.validation_token = None
        job.status, job.cancelling_at = JobStatus.CANCELLING, now
        close_unstarted(session, job_id, RequestStatus.CANCELLED)
    try_finalize(ctx, job_id)  # at once when nothing of it runs; else the sweep finishes it
    return get(ctx, job_id)


def download(ctx: AppContext, job_id: str, target: BinaryIO, errors: bool = False) -> bool:
    """Copy the output (or error) file into target; False when the job has no such file."""
    job = get(ctx, job_id)
    key = job.error_key if errors else job.output_key
    if key is None:
        if job.status not in JobStatus.TERMINAL:
            raise BatchInferError(f"job {job_id} is {job.status}; its results are ready when it is completed")
        return False
    ctx.storage.download(key, target)
    return True
