"""What a unit's commit does to its batch beyond the counts (SQLite, no service). A batch past its
metadata.max_error_rate stops at the commit that passed it: its unstarted requests are cancelled, its finished ones
kept, the reason in its errors, and it ends failed; under the limit, or before max_error_rate_after requests finished,
it runs on. Bad limits are refused at submit time. Reasoning tokens are added to the batch's usage."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import delete, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WebhookEvent, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.errors import InvalidRequest
from batchinfer.jobs.intake.submission import check_metadata
from batchinfer.jobs.records import RequestKey, UnitResult
from batchinfer.jobs.state import ending, units

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, tiny_model, model_cache):
    from batchinfer.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("rate"), model=tiny_model, model_cache=model_cache,
                        database_url=None, storage_url=None, broker_url=None)
    return AppContext.create(settings, migrate=True)


def _job(ctx, metadata: dict, requests: int = 6, in_unit: int = 4) -> None:
    """A running job of `requests` requests, the first `in_unit` running in unit u, the rest pending."""
    now = time.time()
    with transaction(ctx.sessions) as session:
        for model in (WebhookEvent, Request, WorkUnit, Job):
            session.execute(delete(model))
        session.add(Job(id="j", status=JobStatus.IN_PROGRESS, model="m", completion_window_s=60.0, created_at=now,
                        expires_at=now + 60, errors=[], metadata_=metadata, total=requests, in_progress_at=now))
        session.add(WorkUnit(id="u", status=UnitStatus.RUNNING, queue="q", prefix_key="p", num_requests=in_unit,
                             input_key="k", created_at=now))
        session.flush()
        for i in range(requests):
            running = i < in_unit
            session.add(Request(job_id="j", index=i, line=i + 1, custom_id=f"c{i}", unit_id="u" if running else None,
                                status=RequestStatus.RUNNING if running else RequestStatus.PENDING))


def _commit(ctx, failed: int, in_unit: int = 4) -> Job:
    records = {RequestKey("j", i): UnitResult("j", i, i + 1, ok=i >= failed, record={}) for i in range(in_unit)}
    assert units.commit_unit(ctx, "u", "result-key", records) is not None
    with ctx.sessions() as session:
        return session.get(Job, "j")


def test_a_batch_past_its_error_rate_stops_and_ends_failed_with_its_finished_results(ctx):
    _job(ctx, {"max_error_rate": "0.25", "max_error_rate_after": "4"})
    job = _commit(ctx, failed=2)  # 2 of 4 finished failed: 0.5 > 0.25
    assert job.status == JobStatus.CANCELLING and job.errors[-1]["code"] == "max_error_rate_exceeded"
    assert "2 of its 4 finished requests failed" in job.errors[-1]["message"]
    with ctx.sessions() as session:
        statuses = dict(session.execute(select(Request.index, Request.status)).all())
        assert statuses == {0: "failed", 1: "failed", 2: "completed", 3: "completed", 4: "cancelled", 5: "cancelled"}
        claimed = ending.claim_finalize(session, "j", time.time())
        session.commit()
    with transaction(ctx.sessions) as session:
        ending.end_finalized(session, "j", claimed, "out", "err")
    with ctx.sessions() as session:
        job = session.get(Job, "j")
        assert (job.status, job.output_key, job.completed, job.failed) == (JobStatus.FAILED, "out", 2, 4)


@pytest.mark.parametrize("metadata,failed", [
    ({"max_error_rate": "0.5", "max_error_rate_after": "4"}, 2),  # at the limit, not past it
    ({"max_error_rate": "0.1"}, 4),  # fewer than 50 finished (the default after)
    ({}, 4),  # no limit
])
def test_a_batch_within_its_limit_runs_on(ctx, metadata, failed):
    _job(ctx, metadata)
    job = _commit(ctx, failed=failed)
    assert job.status == JobStatus.IN_PROGRESS and job.errors == []


@pytest.mark.parametrize("metadata,param", [({"max_error_rate": "0"}, "metadata.max_error_rate"),
                                            ({"max_error_rate": "half"}, "metadata.max_error_rate"),
                                            ({"max_error_rate": "1.5"}, "metadata.max_error_rate"),
                                            ({"max_error_rate": "0.2", "max_error_rate_after": "0"},
                                             "metadata.max_error_rate_after")])
def test_a_bad_limit_is_refused_at_submit_naming_it(ctx, metadata, param):
    with pytest.raises(InvalidRequest) as refused:
        check_metadata(ctx, metadata)
    assert refused.value.param == param and param in str(refused.value)


def test_a_commit_adds_its_reasoning_tokens_to_the_batch_usage(ctx):
    from batchinfer.jobs.views.batch_view import batch_object

    _job(ctx, {})
    records = {RequestKey("j", i): UnitResult("j", i, i + 1, ok=True, record={}, reasoning_tokens=7) for i in range(4)}
    assert units.commit_unit(ctx, "u", "result-key", records) is not None
    with ctx.sessions() as session:
        assert batch_object(session.get(Job, "j"))["usage"]["output_tokens_details"] == {"reasoning_tokens": 28}
