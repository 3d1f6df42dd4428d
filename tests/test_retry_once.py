"""A batch has one retry unfinished at a time (jobs/retry.py): retries racing on one batch make one retry batch
and every caller gets that one; another request meanwhile is a conflict; once the retry ends, the batch may be
retried anew."""
from __future__ import annotations

import io
import threading

import pytest
from sqlalchemy import func, select

from batchinfer.db.models import Job
from batchinfer.jobs import service
from batchinfer.jobs.finalize.merged import RETRY_OF
from batchinfer.errors import JobConflict
from batchinfer.jobs.retry import create_retry
from jobfiles import chat_line

pytestmark = pytest.mark.fast  # SQLite and local files: the race is decided by the key's primary key


def cancelled_batch(ctx) -> str:
    data = "".join(chat_line(f"r{i}", f"q{i}", max_tokens=1) + "\n" for i in range(5)).encode()
    job = service.submit(ctx, io.BytesIO(data))
    assert service.cancel(ctx, job.id).status == "cancelled"
    return job.id


def retries_of(ctx, job_id: str) -> list[str]:
    with ctx.sessions() as session:
        jobs = session.scalars(select(Job).where(Job.id != job_id)).all()
        return [j.id for j in jobs if (j.metadata_ or {}).get(RETRY_OF) == job_id]


def test_concurrent_retries_of_one_batch_make_one_retry_batch(make_context):
    ctx = make_context()
    original = cancelled_batch(ctx)
    start, made, failed = threading.Barrier(4), [], []

    def retry() -> None:
        start.wait()
        try:
            made.append(create_retry(ctx, original).id)
        except Exception as exc:  # noqa: BLE001 (the assertion below names it)
            failed.append(exc)

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failed, failed
    assert len(made) == 4 and len(set(made)) == 1  # was 4 batches, each running the same lines
    assert retries_of(ctx, original) == made[:1]
    with ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 2


def test_a_retry_asking_otherwise_meanwhile_is_a_conflict_and_an_ended_retry_frees_the_batch(make_context):
    ctx = make_context()
    original = cancelled_batch(ctx)
    first = create_retry(ctx, original)
    assert create_retry(ctx, original).id == first.id
    with pytest.raises(JobConflict, match="has a retry that has not ended"):
        create_retry(ctx, original, completion_window="48h")
    assert service.cancel(ctx, first.id).status == "cancelled"
    again = create_retry(ctx, original, completion_window="48h")
    assert again.id != first.id and sorted(retries_of(ctx, original)) == sorted([first.id, again.id])
