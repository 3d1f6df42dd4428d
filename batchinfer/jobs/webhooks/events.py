"""Batch events in OpenAI's shape (`batch.completed`, ...), written to the webhook outbox in the same
transaction that ends the batch, so an ended batch always has its event and never two."""
from __future__ import annotations

import json
import time

from sqlalchemy.orm import Session

from batchinfer.db.models import ApiKey, Job, JobStatus, WebhookEvent, WebhookStatus

METADATA_KEY = "webhook_url"  # a batch's own receiver, in its metadata; it wins over its key's
EVENT_TYPES: dict[str, str] = {JobStatus.COMPLETED: "batch.completed", JobStatus.FAILED: "batch.failed",
                               JobStatus.CANCELLED: "batch.cancelled", JobStatus.EXPIRED: "batch.expired"}


def event_id(job_id: str) -> str:
    return "evt_" + job_id.removeprefix("batch_")


def event_body(job: Job, now: float) -> str:
    event = {"object": "event", "id": event_id(job.id), "type": EVENT_TYPES[job.status], "created_at": int(now),
             "data": {"id": job.id}}
    return json.dumps(event, separators=(",", ":"))


def receiver_url(session: Session, job: Job) -> str | None:
    """The batch's own webhook_url (metadata), else its key's, else none."""
    url = (job.metadata_ or {}).get(METADATA_KEY)
    if not url and job.owner_id:
        key = session.get(ApiKey, job.owner_id)
        url = key.webhook_url if key is not None else None
    return url or None


def record_final(session: Session, job: Job, now: float | None = None) -> WebhookEvent | None:
    """Call in the transaction that sets a final status: queues the batch's event when it has a receiver."""
    url = receiver_url(session, job)
    if not url or job.status not in EVENT_TYPES:
        return None
    now = time.time() if now is None else now
    event = WebhookEvent(id=event_id(job.id), job_id=job.id, owner_id=job.owner_id,
                         type=EVENT_TYPES[job.status], url=url, body=event_body(job, now),
                         status=WebhookStatus.PENDING, attempts=0, created_at=now, next_attempt_at=now)
    session.add(event)
    return event
