"""A batch that has gone wrong stops itself: `metadata.max_error_rate` (a share of failed requests, "0.2") checked
after each unit's commit, once `metadata.max_error_rate_after` requests have finished (50 by default). Past it the
batch stops as a cancel stops it (running requests end, unstarted ones are cancelled, finished results are kept)
and ends `failed`, the reason in its errors."""
from __future__ import annotations

import time

from sqlalchemy import select

from batchinfer.db.models import Job
from batchinfer.jobs.state import table as T
from batchinfer.jobs.state.ending import STOPPED_CODE, close_unstarted

DEFAULT_AFTER = 50


def limits(metadata: dict | None) -> tuple[float, int] | None:
    """(rate, after) of a batch's metadata, or None: no limit. Values are strings (OpenAI's metadata) or numbers;
    submission checked them (intake.submission)."""
    meta = metadata or {}
    if meta.get("max_error_rate") in (None, ""):
        return None
    return float(meta["max_error_rate"]), int(meta.get("max_error_rate_after") or DEFAULT_AFTER)


def stop_past_limit(session, job_ids: list[str]) -> list[str]:
    """Stop each of the jobs (locked by the caller's commit) whose failed share passed its limit; returns them."""
    stopped = []
    rows = session.scalars(select(Job).where(Job.id.in_(job_ids)).order_by(Job.id)
                           .execution_options(populate_existing=True)).all()  # the counts just added
    for job in rows:
        found = limits(job.metadata_)
        finished = job.completed + job.failed
        if found is None or not T.STOP_JOB.allows(job.status) or finished < found[1] or job.failed <= found[0] * finished:
            continue
        T.apply(job, T.STOP_JOB, time.time())
        job.errors = [*(job.errors or []), {"line": None, "code": STOPPED_CODE, "param": "metadata.max_error_rate", "message": (
            f"The batch stopped: {job.failed} of its {finished} finished requests failed, over its max_error_rate "
            f"{found[0]:g}. Finished results are kept; the requests it had not run are cancelled.")}]
        job.error_count = (job.error_count or 0) + 1
        close_unstarted(session, job.id, T.CANCEL_UNSTARTED)
        stopped.append(job.id)
    return stopped

