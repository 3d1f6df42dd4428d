"""Retry what did not finish: a new batch from the original input lines whose requests ended failed, expired
or cancelled (optionally only some error codes), linked to the original by metadata.retry_of. Nothing that
succeeded runs again, and a batch has one retry unfinished at a time: concurrent retries of it answer with the
one that was made (a retry asking for other codes or another window meanwhile: 409), under an idempotency key
named after the batch (jobs.idempotency), freed once that retry has ended."""
from __future__ import annotations

import json
from tempfile import SpooledTemporaryFile
from typing import BinaryIO, cast

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus
from batchinfer.errors import InvalidRequest, JobConflict
from batchinfer.jobs import idempotency, service
from batchinfer.jobs.endpoints.fields import MAX_METADATA_PAIRS
from batchinfer.jobs.finalize.merged import RETRY_OF
RETRYABLE = (RequestStatus.FAILED, RequestStatus.EXPIRED, RequestStatus.CANCELLED)
UNFINISHED_CODES: dict[str, str] = {RequestStatus.CANCELLED: "batch_cancelled", RequestStatus.EXPIRED: "batch_expired"}
SPOOL_BYTES = 8 * 1024 * 1024


def create_retry(ctx: AppContext, job_id: str, owner=service.ANY_OWNER, codes: set[str] | None = None,
                 completion_window: str | None = None) -> Job:
    """The retry batch, in `validating` (the caller validates it as any new batch). Lines that were invalid
    are not retried: they would fail the same way. The window is `completion_window`, else the setting's
    (not the original's: a batch that expired would expire again)."""
    job = service.get(ctx, job_id, owner=owner)
    if job.status not in JobStatus.TERMINAL:
        raise JobConflict(f"Batch {job_id} is {job.status}; retry it once it has ended.", code="conflict")
    wanted = retry_ids(ctx, job, codes)
    if not wanted:
        which = f" with code {', '.join(sorted(codes))}" if codes else ""
        raise InvalidRequest(f"Batch {job_id} has no failed, expired or cancelled request{which}.", code="nothing_to_retry")
    asked = idempotency.request_hash({"codes": sorted(codes) if codes else None, "window": completion_window})
    claim = idempotency.Claim(job.owner_id or "", "retries", job.id, asked)
    try:
        retry, _ = idempotency.once(ctx, claim, lambda retry_id: _unfinished(ctx, retry_id),
                                    lambda made_under: _make(ctx, job, wanted, completion_window, made_under))
    except idempotency.IdempotencyConflict:  # the key is ours, not the caller's: the batch's state is the conflict
        raise JobConflict(f"Batch {job_id} has a retry that has not ended, made with other error_codes or "
                          "completion_window; retry it again once that one has ended.", code="conflict") from None
    return retry


def _unfinished(ctx: AppContext, job_id: str) -> Job | None:
    """The retry made under the batch's key while it has not ended (once it has, the batch may be retried anew)."""
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    return job if job is not None and job.status not in JobStatus.TERMINAL else None


def _make(ctx: AppContext, job: Job, wanted: set[str], completion_window: str | None, claim: idempotency.Claim) -> Job:
    with SpooledTemporaryFile(SPOOL_BYTES) as spooled:
        source = cast(BinaryIO, spooled)
        _copy_lines(ctx, job, wanted, source)
        source.seek(0)
        return service.create_job(ctx, source=source, filename=job.input_filename, model=job.model,
                                  metadata=_metadata(job), completion_window=completion_window,
                                  skip_invalid=job.skip_invalid, priority=job.priority, owner_id=job.owner_id,
                                  endpoint=job.endpoint, output_expires_after_s=job.output_expires_after_s,
                                  idempotency=claim)


def retry_ids(ctx: AppContext, job: Job, codes: set[str] | None = None) -> set[str]:
    """custom_ids of the job's requests that did not succeed, those whose error code is in `codes` when given."""
    with ctx.sessions() as session:
        rows = list(session.execute(select(Request.custom_id, Request.status)
                                    .where(Request.job_id == job.id, Request.status.in_(RETRYABLE))))
    if codes is None:
        return {custom_id for custom_id, _ in rows}
    code_of = {cid: UNFINISHED_CODES[status] for cid, status in rows if status in UNFINISHED_CODES}
    failed = {cid for cid, status in rows if status == RequestStatus.FAILED}
    if failed and job.kept_key(errors=True):
        with ctx.storage.open_read(job.kept_key(errors=True) or "") as stream:
            for raw in stream:
                entry = json.loads(raw)
                if entry.get("custom_id") in failed:
                    code_of[entry["custom_id"]] = entry["error"]["code"]
    return {cid for cid, code in code_of.items() if code in codes}


def _copy_lines(ctx: AppContext, job: Job, wanted: set[str], target: BinaryIO) -> None:
    """The original lines of `wanted`, byte for byte, in input order."""
    left = set(wanted)
    with ctx.storage.open_read(job.input_key or "") as stream:
        for raw in stream:
            try:
                custom_id = json.loads(raw).get("custom_id")
            except (ValueError, AttributeError, RecursionError):  # a line that was invalid: never retried
                continue
            if custom_id in left:
                left.discard(custom_id)
                target.write(raw if raw.endswith(b"\n") else raw + b"\n")


def _metadata(job: Job) -> dict[str, str]:
    kept = {k: v for k, v in (job.metadata_ or {}).items() if k != RETRY_OF}
    return {**dict(list(kept.items())[:MAX_METADATA_PAIRS - 1]), RETRY_OF: job.id}
