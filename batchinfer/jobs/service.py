"""The job service: submit, status, list, cancel and download batch jobs (periodic steps: jobs.lifecycle;
every status change: jobs.state)."""
from __future__ import annotations

import time
from typing import BinaryIO, Callable

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.errors import BatchInferError, JobNotFound
from batchinfer.jobs.intake.submission import create_job
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import ending


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
