"""What each model's workers have yet to do, for an autoscaler (GET /v1/models, /metrics): requests waiting for a
worker (pending or planned in a unit not started), requests running, and how long the oldest waiting job has
waited (since it was queued; a batch still validating since it was created)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, select

from batchinfer.db.models import Job, JobStatus, Request, RequestStatus

# streamed batches run while they validate: their requests wait for workers too
_WAITING_JOBS = (JobStatus.VALIDATING, *JobStatus.RUNNABLE)


@dataclass(frozen=True)
class Backlog:
    pending: int = 0  # requests no worker runs yet
    running: int = 0
    oldest_pending_s: float = 0.0  # age of the oldest job with a request pending (0: none)


def model_backlogs(session, now: float | None = None) -> dict[str, Backlog]:
    """By model id; a model with nothing open is absent. One grouped query over open jobs' requests (the
    requests' (job, status) index), whatever the number of requests."""
    now = time.time() if now is None else now
    since = func.coalesce(Job.queued_at, Job.created_at)
    rows = session.execute(select(Job.model, Request.status, func.count(), func.min(since))
                           .join(Request, Request.job_id == Job.id)
                           .where(Job.status.in_(_WAITING_JOBS), Request.status.in_(RequestStatus.OPEN))
                           .group_by(Job.model, Request.status)).all()
    found: dict[str, Backlog] = {}
    for model, status, count, oldest in rows:
        was = found.get(model or "", Backlog())
        if status == RequestStatus.RUNNING:
            found[model or ""] = Backlog(was.pending, was.running + count, was.oldest_pending_s)
        else:
            age = max(0.0, now - oldest) if oldest is not None else 0.0
            found[model or ""] = Backlog(was.pending + count, was.running, max(was.oldest_pending_s, age))
    return found
