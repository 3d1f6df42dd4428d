"""One file for a batch and its retries: each custom_id once, the latest successful result winning, else the
latest error. Lines come batch by batch, oldest first: the successes, then the requests that never succeeded."""
from __future__ import annotations

import json
from typing import Iterator

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.errors import BatchInferError

RETRY_OF = "retry_of"  # the metadata key naming the batch a retry came from (jobs.retry)


def family(ctx: AppContext, job: Job) -> list[Job]:
    """The batch the chain started from, every retry made from it or from a retry of it, oldest first."""
    root = job
    with ctx.sessions() as session:
        while (parent_id := (root.metadata_ or {}).get(RETRY_OF)) and len(parent_id) <= 64:
            parent = session.get(Job, parent_id)
            if parent is None or parent.owner_id != job.owner_id:
                break
            root = parent
        found, frontier = {root.id: root}, [root.id]
        while frontier:
            children = [c for c in session.scalars(select(Job).where(Job.metadata_[RETRY_OF].as_string().in_(frontier)))
                        if c.owner_id == job.owner_id and c.id not in found]
            found.update((c.id, c) for c in children)
            frontier = [c.id for c in children]
    return sorted(found.values(), key=lambda j: (j.created_at, j.id))


def merged_lines(ctx: AppContext, job: Job) -> Iterator[bytes]:
    """The job's file with its retries'; raises at once (not at the first line) when the job is still running."""
    if job.status not in JobStatus.TERMINAL:
        raise BatchInferError(f"batch {job.id} is {job.status}; its results are ready when it has ended")
    return _merged(ctx, job)


def _merged(ctx: AppContext, job: Job) -> Iterator[bytes]:
    jobs = [j for j in family(ctx, job) if j.status in JobStatus.TERMINAL]
    success, error = _winners(ctx, jobs)
    for n, j in enumerate(jobs):
        yield from _pick(ctx, j.output_key, lambda cid, n=n: success.get(cid) == n)
    for n, j in enumerate(jobs):
        # a line with no custom_id (not even JSON) is only in the first batch: no retry holds it
        yield from _pick(ctx, j.error_key, lambda cid, n=n: (cid is None and n == 0)
                         or (cid is not None and cid not in success and error.get(cid) == n))


def _winners(ctx: AppContext, jobs: list[Job]) -> tuple[dict[str, int], dict[str, int]]:
    """custom_id -> the position in `jobs` of its newest success, and of its newest error."""
    success: dict[str, int] = {}
    error: dict[str, int] = {}
    for n, j in enumerate(jobs):
        for winners, key in ((success, j.output_key), (error, j.error_key)):
            for custom_id, _ in _entries(ctx, key):
                if custom_id is not None:
                    winners[custom_id] = n
    return success, error


def _entries(ctx: AppContext, key: str | None) -> Iterator[tuple[str | None, bytes]]:
    if not key or not ctx.storage.exists(key):
        return
    with ctx.storage.open_read(key) as stream:
        for raw in stream:
            if raw.strip():
                yield json.loads(raw).get("custom_id"), raw if raw.endswith(b"\n") else raw + b"\n"


def _pick(ctx: AppContext, key: str | None, keep) -> Iterator[bytes]:
    for custom_id, raw in _entries(ctx, key):
        if keep(custom_id):
            yield raw
