"""The job service: submit, status, list, cancel and download batch jobs (periodic steps: jobs.lifecycle;
every status change: jobs.state)."""
from __future__ import annotations

import time
from typing import BinaryIO, Callable

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.error_codes import FILE_CODES, batch_not_found, file_not_found
from batchinfer.errors import BatchInferError, InvalidRequest, JobNotFound, shown
from batchinfer.jobs import files, record_store
from batchinfer.jobs.idempotency import Claim
from batchinfer.jobs.intake.submission import create_job
from batchinfer.jobs.records import loads
from batchinfer.jobs.state import intake as intake_state
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import ending, pausing


def submit(ctx: AppContext, source: BinaryIO, filename: str = "", model: str | None = None,
           metadata: dict | None = None, completion_window: str | None = None, skip_invalid: bool = False,
           priority: int = 0, now: float | None = None, on_created: Callable[[Job], object] | None = None,
           on_rows: Callable[[], None] | None = None, strict: bool = False) -> Job:
    """Store the input, validate it line by line, and queue the job (or fail it with every error listed).
    on_created sees the job as soon as it exists (the CLI prints its id before validation); on_rows asks for a
    dispatch while a big file is still validated (settings.stream_dispatch). strict: a body the endpoint refuses
    fails the job too (else that request fails alone, as OpenAI's)."""
    job = create_job(ctx, source=source, filename=filename, model=model, metadata=metadata,
                     completion_window=completion_window, skip_invalid=skip_invalid, strict=strict, priority=priority,
                     now=now)
    if on_created is not None:
        on_created(job)
    try:
        return validate_job(ctx, job.id, on_rows=on_rows)
    except KeyboardInterrupt:  # whoever submitted stopped it: it ends now, rather than run after the sweep finds it
        cancel(ctx, job.id)
        raise KeyboardInterrupt(f"job {job.id} cancelled before its validation ended") from None


def create_from_file(ctx: AppContext, owner: str, file_id: str, idempotency: Claim | None = None, **fields) -> Job:
    """A batch of an uploaded file, in `validating` (the caller has it validated), as OpenAI's create: a file that
    cannot be found still makes the batch, failed at once with `invalid_request` naming file_id (so a client that
    creates then polls sees why). fields: create_job's (endpoint, metadata, completion_window, ...)."""
    try:
        upload: files.FileView | None = files.get(ctx, owner, file_id)
    except JobNotFound:
        upload = None
    if upload is not None and upload.purpose != "batch":
        raise InvalidRequest("input_file_id must be a file uploaded with purpose 'batch'.", code="invalid_value",
                             param="input_file_id")
    job = create_job(ctx, input_key=upload.storage_key if upload else None, filename=upload.filename if upload else "",
                     owner_id=owner, input_file_id=file_id, idempotency=idempotency, **fields)
    if upload is None:
        intake_state.fail_validation(ctx, job.id, file_not_found(shown(file_id)), code="invalid_request", param="file_id")
        job = get(ctx, job.id)
    return job


def bad_lines(ctx: AppContext, job: Job, limit: int) -> tuple[list[dict], int]:
    """(the first `limit` bad lines of a validated job, how many there are), in line order, each as a batch error
    ({line, code, param, message}) with `fails_alone`: a body the endpoint refused (that request's own 400, the rest
    run), else a problem that fails the batch (or, with skip_invalid, leaves the line out). The file's own problems
    (an empty file, too many lines) come first."""
    found = [{**e, "fails_alone": False} for e in job.errors or [] if e.get("line") is None or e["code"] in FILE_CODES]
    count = len(found)
    for _, raw in record_store.invalid_lines(ctx.storage, job.id):
        count += 1
        if len(found) < limit:
            entry = loads(raw)
            found.append({**entry["error"], "fails_alone": entry.get("response") is not None})
    return found, count


# `owner` scopes a call to one tenant: another tenant's job answers exactly as a missing one.
ANY_OWNER = object()


def get(ctx: AppContext, job_id: str, owner=ANY_OWNER) -> Job:
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    if job is None or (owner is not ANY_OWNER and job.owner_id != owner):
        raise JobNotFound(batch_not_found(shown(job_id)))
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


def pause(ctx: AppContext, job_id: str, now: float | None = None, owner=ANY_OWNER) -> Job:
    """No new unit of it starts; running ones finish and count; its window keeps running."""
    pausing.pause(ctx, job_id, now or time.time(), lambda job: owner is ANY_OWNER or job.owner_id == owner)
    return get(ctx, job_id)


def resume(ctx: AppContext, job_id: str, owner=ANY_OWNER) -> Job:
    """Runnable again: the next dispatch plans what is left (the caller asks for one); ended at once when nothing is."""
    pausing.resume(ctx, job_id, lambda job: owner is ANY_OWNER or job.owner_id == owner)
    try_finalize(ctx, job_id)
    return get(ctx, job_id)


def download(ctx: AppContext, job_id: str, target: BinaryIO, errors: bool = False) -> bool:
    """Copy the output (or error) file into target; False when the job has no such file."""
    job = get(ctx, job_id)
    key = job.kept_key(errors)
    if key is None:
        if (job.error_key if errors else job.output_key) is not None:
            raise BatchInferError(f"the {'error' if errors else 'output'} file of batch {job_id} was deleted")
        if job.status not in JobStatus.TERMINAL:
            raise BatchInferError(f"batch {job_id} is {job.status}; its results are ready when it has ended")
        return False
    ctx.storage.download(key, target)
    return True
