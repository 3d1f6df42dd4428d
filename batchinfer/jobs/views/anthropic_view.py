"""A job as Anthropic's Message Batch, and its results as Anthropic's JSONL: our lifecycle mapped onto
processing_status and request_counts, each request's line onto its result (endpoints.anthropic)."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator

from sqlalchemy import func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus
from batchinfer.jobs.endpoints import anthropic

ID_PREFIX, JOB_PREFIX = "msgbatch_", "batch_"
STATUS: dict[str, str] = {JobStatus.CANCELLING: "canceling", **{s: "ended" for s in JobStatus.TERMINAL}}
COUNTED: dict[str, str] = {RequestStatus.COMPLETED: "succeeded", RequestStatus.FAILED: "errored",
           RequestStatus.CANCELLED: "canceled", RequestStatus.EXPIRED: "expired"}
# a request never reported by a unit (its batch ended in validation) ends as its batch did
UNREPORTED: dict[str, str] = {JobStatus.CANCELLED: "canceled", JobStatus.EXPIRED: "expired"}


def message_batch_id(job_id: str) -> str:
    return ID_PREFIX + job_id.removeprefix(JOB_PREFIX)


def job_id(batch_id: str) -> str:
    return JOB_PREFIX + batch_id.removeprefix(ID_PREFIX) if batch_id.startswith(ID_PREFIX) else ""


def _time(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z") if ts is not None else None


def ended_at(job: Job) -> float | None:
    return job.completed_at or job.failed_at or job.expired_at or job.cancelled_at


def request_counts(ctx: AppContext, job: Job) -> dict[str, int]:
    """Live counts that always sum to the batch's size: invalid lines count as errored."""
    with ctx.sessions() as session:
        rows = session.execute(select(Request.status, func.count()).where(Request.job_id == job.id)
                               .group_by(Request.status))
        counts = {name: 0 for name in ("succeeded", "errored", "canceled", "expired")}
        for status, n in rows:
            if status in COUNTED:
                counts[COUNTED[status]] += n
    counts["errored"] += job.invalid or 0
    rest = max(0, (job.total or 0) - sum(counts.values()))
    if job.status in JobStatus.TERMINAL:
        counts[UNREPORTED.get(job.status, "errored")] += rest
        rest = 0
    return {"processing": rest, **counts}


def message_batch(ctx: AppContext, job: Job, base_url: str) -> dict:
    status = STATUS.get(job.status, "in_progress")
    batch_id = message_batch_id(job.id)
    return {"id": batch_id, "type": "message_batch", "processing_status": status,
            "request_counts": request_counts(ctx, job), "ended_at": _time(ended_at(job)),
            "created_at": _time(job.created_at), "expires_at": _time(job.expires_at), "archived_at": None,
            "cancel_initiated_at": _time(job.cancelling_at),
            "results_url": f"{base_url.rstrip('/')}/v1/messages/batches/{batch_id}/results" if status == "ended" else None}


def results(ctx: AppContext, job: Job) -> Iterator[bytes]:
    """One line per request: the output file's, then the error file's, then any request neither reports."""
    seen: set[str] = set()
    for key in (job.output_key, job.error_key):
        if key and ctx.storage.exists(key):
            for raw in _lines(ctx, key):
                entry = json.loads(raw)
                if entry.get("custom_id") is None or entry["custom_id"] in seen:
                    continue
                seen.add(entry["custom_id"])
                yield _dumps({"custom_id": entry["custom_id"], "result": anthropic.result(entry)})
    unreported = UNREPORTED.get(job.status)
    for raw in _lines(ctx, job.input_key or ""):
        custom_id = json.loads(raw)["custom_id"]
        if custom_id not in seen:
            seen.add(custom_id)
            yield _dumps({"custom_id": custom_id, "result": {"type": unreported} if unreported else
                          anthropic.errored("api_error", "the request ended without a result")})


def _lines(ctx: AppContext, key: str) -> Iterator[bytes]:
    if not key:
        return
    with ctx.storage.open_read(key) as stream:
        for raw in stream:
            if raw.strip():
                yield raw


def _dumps(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
