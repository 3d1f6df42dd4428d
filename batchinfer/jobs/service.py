"""The job service: submit, status, list, cancel and download batch jobs (periodic steps: jobs.lifecycle;
every status change: jobs.state)."""
from __future__ import annotations

import time
import uuid
from typing import BinaryIO, Callable

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.errors import BatchInferError, JobNotFound, excerpt
from batchinfer.jobs.tenancy import scopes
from batchinfer.jobs import record_store
from batchinfer.jobs.intake import submission
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import ending
from batchinfer.jobs.state import intake as state


def new_job_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def submit(ctx: AppContext, source: BinaryIO, filename: str = "", model: str | None = None,
           metadata: dict | None = None, completion_window: str | None = None, skip_invalid: bool = False,
           priority: int = 0, now: float | None = None, on_created: Callable[[Job], object] | None = None,
           on_rows: Callable[[], None] | None = None) -> Job:
    """Store the input, validate it line by line, and queue the job (or fail it with every error listed).
    on_created sees the job as soon as it exists (the CLI prints its id before validation); on_rows asks for a
    dispatch while a big file is still validated (settings.stream_dispatch)."""
    job = create_job(ctx, source=source, filename=filename, model=model, metadata=metadata,
                     completion_window=completion_window, skip_invalid=skip_invalid, priority=priority, now=now)
    if on_created is not None:
        on_created(job)
    try:
        return validate_job(ctx, job.id, on_rows=on_rows)
    except KeyboardInterrupt:  # whoever submitted stopped it: it ends now, rather than run after the sweep finds it
        cancel(ctx, job.id)
        raise KeyboardInterrupt(f"job {job.id} cancelled before its validation ended") from None


def create_job(ctx: AppContext, *, source: BinaryIO | None = None, input_key: str | None = None, filename: str = "",
               model: str | None = None, metadata: dict | None = None, completion_window: str | None = None,
               skip_invalid: bool = False, priority: int = 0, now: float | None = None, **fields) -> Job:
    """A job row in `validating`. Its input is `input_key` when already stored (an uploaded file, not copied),
    else `source`, streamed to the job's own input key. `fields` are further Job columns (owner_id, ...).
    If storing `source` fails, the job is failed at once naming the cause, and the error is raised."""
    model = submission.check_model(ctx, model)
    window = submission.completion_window_s(ctx, completion_window)
    metadata = submission.check_metadata(ctx, metadata)
    submission.check_active_limit(ctx, fields.get("owner_id"))
    fields["cache_scope"] = scopes.job_scope(ctx, fields.get("owner_id"))
    now = now or time.time()
    job_id = new_job_id()
    job = state.create_job(ctx, id=job_id, model=model, input_filename=filename, metadata_=metadata,
                           skip_invalid=skip_invalid, priority=priority, completion_window_s=window, created_at=now,
                           expires_at=now + window, input_key=input_key or record_store.job_input(job_id), errors=[],
                           **fields)
    if source is not None:
        _store_input(ctx, job, source)
    return job


def _store_input(ctx: AppContext, job: Job, source: BinaryIO) -> None:
    try:
        ctx.storage.upload(job.input_key or record_store.job_input(job.id), source)
    except Exception as exc:  # storage down: the job can never run, so it ends now rather than at the sweep
        cause = f"could not store the input file: {type(exc).__name__}: {excerpt(str(exc))}"
        try:
            state.fail_validation(ctx, job.id, cause)
        except Exception:  # the database is down too: the sweep fails it once validation_stale_s has passed
            pass
        raise BatchInferError(f"job {job.id}: {cause}") from exc


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
    ending.cancel(ctx, job_id, now or time.time(), lambda job: owner is ANY_OWNER or job.owner_id == owner)
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
