"""The job service's side of Anthropic's Message Batches: create one (as our chat lines), find, list and
delete a tenant's message batches."""
from __future__ import annotations

import io

from sqlalchemy import delete as sql_delete
from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request
from batchinfer.db.session import transaction
from batchinfer.errors import JobConflict, JobNotFound
from batchinfer.jobs import record_store, service
from batchinfer.jobs.endpoints.anthropic import MESSAGES_ENDPOINT, CreateBody, input_lines
from batchinfer.jobs.views.anthropic_view import job_id


def create(ctx: AppContext, owner: str, body: CreateBody) -> Job:
    """A job in `validating`; lines our validation refuses (an unknown model, too long a prompt) end errored
    while the rest run, as each of Anthropic's requests succeeds or fails alone."""
    return service.create_job(ctx, source=io.BytesIO(input_lines(body)), filename="message_batch.jsonl",
                              skip_invalid=True, owner_id=owner, endpoint=MESSAGES_ENDPOINT,
                              total=len(body.requests), completion_window="24h")


def get(ctx: AppContext, owner: str, batch_id: str) -> Job:
    """A message batch of this owner; any other id (another tenant's, an OpenAI batch) is not found."""
    with ctx.sessions() as session:
        job = session.get(Job, job_id(batch_id)) if job_id(batch_id) else None
    if job is None or job.owner_id != owner or job.endpoint != MESSAGES_ENDPOINT:
        raise JobNotFound(f"no message batch {batch_id[:80]!r}")
    return job


def list_page(ctx: AppContext, owner: str, limit: int, after_id: str | None = None,
              before_id: str | None = None) -> list[Job]:
    """Newest first, up to limit + 1 (the extra one says there is more): after_id pages to older batches,
    before_id to newer ones."""
    query = select(Job).where(Job.owner_id == owner, Job.endpoint == MESSAGES_ENDPOINT)
    anchor_id = after_id or before_id
    if anchor_id:
        anchor = get(ctx, owner, anchor_id)
        older = (Job.created_at < anchor.created_at) | ((Job.created_at == anchor.created_at) & (Job.id < anchor.id))
        newer = (Job.created_at > anchor.created_at) | ((Job.created_at == anchor.created_at) & (Job.id > anchor.id))
        query = query.where(older if after_id else newer)
    newest_first = before_id is None
    order = (Job.created_at.desc(), Job.id.desc()) if newest_first else (Job.created_at, Job.id)
    with ctx.sessions() as session:
        jobs = list(session.scalars(query.order_by(*order).limit(limit + 1)))
    if not newest_first:  # the `limit` newest batches just newer than the anchor, shown newest first
        jobs = jobs[:limit][::-1] + jobs[limit:]
    return jobs


def delete(ctx: AppContext, owner: str, batch_id: str) -> None:
    """An ended batch and its files; one still processing must be cancelled first (as Anthropic requires)."""
    job = get(ctx, owner, batch_id)
    with transaction(ctx.sessions) as session:
        row = session.get(Job, job.id, with_for_update=True)
        if row is None:
            raise JobNotFound(f"no message batch {batch_id[:80]!r}")
        if row.status not in JobStatus.TERMINAL:
            raise JobConflict(f"message batch {batch_id[:80]} is still processing; cancel it before deleting it")
        session.execute(sql_delete(Request).where(Request.job_id == job.id))
        session.delete(row)
    record_store.delete_job_files(ctx.storage, job.id, job.total or 0, job.input_key, job.output_key, job.error_key)
