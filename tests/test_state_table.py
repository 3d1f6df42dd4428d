"""The transition table of jobs, requests and units, move by move: each state a move may start from moves,
every other state is refused and left as it was (SQLite, no service)."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import delete, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WebhookEvent, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.errors import JobConflict
from batchinfer.jobs.records import Origin, RequestKey
from batchinfer.jobs.state import ending, pausing, table, units
from batchinfer.jobs.state import intake as state

pytestmark = pytest.mark.fast

STATES = {"job": list(JobStatus), "request": list(RequestStatus), "unit": list(UnitStatus)}
MOVES = [t for t in table.TRANSITIONS if t.current_states]
CASES = [pytest.param(t, status, id=f"{t.subject}:{t.name}:{status}") for t in MOVES for status in STATES[t.subject]]


@pytest.fixture(scope="module")
def shared_context(tmp_path_factory, tiny_model, model_cache):
    """One migrated SQLite database for the module (migrating costs a quarter second a test)."""
    from batchinfer.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("state"), model=tiny_model, model_cache=model_cache,
                        database_url=None, storage_url=None, broker_url=None)
    return AppContext.create(settings, migrate=True)


@pytest.fixture
def make_context(shared_context):
    """The shared database, emptied: each test starts with no rows."""
    def make():
        with transaction(shared_context.sessions) as session:
            for model in (WebhookEvent, Request, WorkUnit, Job):
                session.execute(delete(model))
        return shared_context

    return make


def _job(job_id: str, status: str, **fields) -> Job:
    now = time.time()
    return Job(id=job_id, status=status, model="m", completion_window_s=60.0, created_at=now, expires_at=now + 60,
               errors=[], **fields)


def _rows(session, subject: str, status: str):
    """A row of `subject` in `status` (with the job and unit it hangs from), and the condition that selects it."""
    if subject == "job":
        session.add(_job("j", status))
        return Job, Job.id == "j"
    session.add(_job("j", JobStatus.IN_PROGRESS))
    session.add(WorkUnit(id="u", status=status if subject == "unit" else UnitStatus.QUEUED, queue="q", prefix_key="p",
                         num_requests=1, input_key="k", created_at=time.time()))
    session.flush()
    session.add(Request(job_id="j", index=0, line=1, custom_id="c", unit_id="u",
                        status=status if subject == "request" else RequestStatus.PLANNED))
    if subject == "unit":
        return WorkUnit, WorkUnit.id == "u"
    return Request, Request.job_id == "j"


@pytest.mark.parametrize("t, status", CASES)
def test_a_move_starts_only_from_its_current_states(make_context, t, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        model, where = _rows(session, t.subject, status)
    with transaction(ctx.sessions) as session:
        moved = table.move(session, t, where, now=1.0)
    with ctx.sessions() as session:
        after = session.scalar(select(model.status).where(where))
    if t.allows(status):
        assert (moved, after) == (1, t.next_state)
    else:
        assert (moved, after) == (0, status)


@pytest.mark.parametrize("t, status", [c for c in CASES if c.values[0].subject == "job"])
def test_apply_to_a_loaded_job_refuses_what_the_table_refuses(t, status):
    job = _job("j", status)
    if t.allows(status):
        table.apply(job, t, now=5.0)
        assert job.status == t.next_state and getattr(job, f"{t.next_state}_at") == 5.0
    else:
        with pytest.raises(table.Refused):
            table.apply(job, t, now=5.0)
        assert job.status == status


def test_every_job_state_but_the_first_is_reached_by_some_move():
    reached = {t.next_state for t in table.TRANSITIONS if t.subject == "job" and t.current_states}
    assert reached == set(JobStatus) - {JobStatus.VALIDATING}


@pytest.mark.parametrize("status", list(JobStatus))
def test_cancel_follows_the_table(make_context, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        session.add(_job("j", status))
    if table.CANCEL_JOB.allows(status):
        ending.cancel(ctx, "j", now=2.0)
        with ctx.sessions() as session:
            assert session.get(Job, "j").status == JobStatus.CANCELLING
    elif status in (JobStatus.CANCELLING, JobStatus.CANCELLED):  # OpenAI's: cancelling again answers as it is
        ending.cancel(ctx, "j", now=2.0)
        with ctx.sessions() as session:
            assert session.get(Job, "j").status == status and session.get(Job, "j").cancelling_at is None
    else:
        with pytest.raises(JobConflict, match=f"Cannot cancel a batch with status '{status}'"):
            ending.cancel(ctx, "j", now=2.0)


@pytest.mark.parametrize("status", list(UnitStatus))
def test_start_unit_follows_the_table(make_context, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        _rows(session, "unit", status)
        session.get(Job, "j").status = JobStatus.QUEUED
    started = units.start_unit(ctx, "u", "w")
    with ctx.sessions() as session:
        unit, job = session.get(WorkUnit, "u"), session.get(Job, "j")
        request = session.scalar(select(Request))
    if table.START_UNIT.allows(status):
        assert started is not None and started.to_run == {RequestKey("j", 0): Origin(1, "c")}
        assert (unit.status, job.status, request.status) == (UnitStatus.RUNNING, JobStatus.IN_PROGRESS, RequestStatus.RUNNING)
    else:
        assert started is None and (unit.status, job.status) == (status, JobStatus.QUEUED)


def test_the_commit_fence_lets_one_run_count(make_context):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        _rows(session, "unit", UnitStatus.RUNNING)
    assert units.commit_unit(ctx, "u", "r1", {}) is not None
    assert units.commit_unit(ctx, "u", "r2", {}) is None
    with ctx.sessions() as session:
        assert session.get(WorkUnit, "u").result_key == "r1"


@pytest.mark.parametrize("status", list(JobStatus))
def test_fail_validation_moves_only_a_validating_job(make_context, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        session.add(_job("j", status))
    state.fail_validation(ctx, "j", "cause")
    with ctx.sessions() as session:
        job = session.get(Job, "j")
    assert job.status == (JobStatus.FAILED if status == JobStatus.VALIDATING else status)
    assert (job.errors == []) == (status != JobStatus.VALIDATING)


@pytest.mark.parametrize("status", list(JobStatus))
def test_pause_follows_the_table(make_context, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        session.add(_job("j", status))
    if table.PAUSE_JOB.allows(status) or status == JobStatus.PAUSED:  # pausing again answers as it is
        pausing.pause(ctx, "j", now=2.0)
        with ctx.sessions() as session:
            job = session.get(Job, "j")
            assert job.status == JobStatus.PAUSED and job.paused_at == (2.0 if status != JobStatus.PAUSED else None)
    else:
        with pytest.raises(JobConflict, match=f"Cannot pause a batch with status '{status}'"):
            pausing.pause(ctx, "j", now=2.0)


@pytest.mark.parametrize("started", [True, False])
def test_resume_goes_back_to_where_the_job_was(make_context, started):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        session.add(_job("j", JobStatus.PAUSED, in_progress_at=1.0 if started else None))
    pausing.resume(ctx, "j")
    with ctx.sessions() as session:
        job = session.get(Job, "j")
        assert job.status == (JobStatus.IN_PROGRESS if started else JobStatus.QUEUED)
        assert job.in_progress_at == (1.0 if started else None)  # its first start is kept


@pytest.mark.parametrize("status", list(JobStatus))
def test_resume_refuses_what_is_neither_paused_nor_running(make_context, status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        session.add(_job("j", status))
    if status in (JobStatus.PAUSED, *JobStatus.RUNNABLE):
        pausing.resume(ctx, "j")
    else:
        with pytest.raises(JobConflict, match=f"Cannot resume a batch with status '{status}'"):
            pausing.resume(ctx, "j")


@pytest.mark.parametrize("unit_status", [UnitStatus.QUEUED, UnitStatus.RUNNING])
def test_a_pause_takes_back_requests_only_from_units_not_started(make_context, unit_status):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        _rows(session, "unit", unit_status)
    pausing.pause(ctx, "j", now=2.0)
    with ctx.sessions() as session:
        request = session.scalar(select(Request))
    if unit_status == UnitStatus.QUEUED:  # its unit starts without it; the dispatch after the resume plans it again
        assert (request.status, request.unit_id) == (RequestStatus.PENDING, None)
    else:
        assert (request.status, request.unit_id) == (RequestStatus.PLANNED, "u")


def test_a_unit_that_starts_while_its_job_is_paused_runs_none_of_it(make_context):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        _rows(session, "unit", UnitStatus.QUEUED)
        session.get(Job, "j").status = JobStatus.PAUSED
    started = units.start_unit(ctx, "u", "w")
    assert started is not None and started.to_run == {}


def test_a_paused_job_past_its_window_expires(make_context):
    ctx = make_context()
    with transaction(ctx.sessions) as session:
        _rows(session, "request", RequestStatus.PENDING)
        job = session.get(Job, "j")
        job.status, job.expires_at = JobStatus.PAUSED, time.time() - 1
    assert ending.expire_overdue(ctx, time.time()) == ["j"]
    with ctx.sessions() as session:
        assert session.scalar(select(Request.status)) == RequestStatus.EXPIRED
