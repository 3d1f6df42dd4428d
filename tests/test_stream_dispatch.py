"""Streaming dispatch (settings.stream_dispatch): units of a batch run while the rest of its file is still
validated, and whole-file rules still fail it with nothing kept (real PostgreSQL, local storage, the null engine).

Each test validates a 3,000-line file (3 parts of 1,000) and, at the first committed part, dispatches and runs
every unit it can, in the validation's own thread: so units ran before the queue move, deterministically."""
from __future__ import annotations

import io
from collections import Counter

import pytest
from sqlalchemy import func, select

from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, WorkUnit
from batchinfer.jobs import service
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.planner import PlannerConfig
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.null_generator import NullGenerator
from batchinfer.jobs.units.runner import run_unit
from jobfiles import chat_line, read_output

UNIT = PlannerConfig(max_requests_per_unit=64)
N = 3000


@pytest.fixture
def ctx(make_context, postgres_url, tiny_model):
    return make_context(database_url=postgres_url, model=tiny_model, engine="null", stream_dispatch=True)


def _lines(n: int, last: str | None = None) -> list[str]:
    lines = [chat_line(f"c{i}", f"question {i % 97}", max_tokens=1) for i in range(n)]
    if last is not None:
        lines[-1] = last
    return lines


def _create(ctx, lines: list[str]) -> str:
    source = io.BytesIO(("\n".join(lines) + "\n").encode())
    return service.create_job(ctx, source=source, filename="stream.jsonl").id


def _dispatch_and_run(ctx) -> list[str]:
    generator = NullGenerator.from_settings(ctx.settings)
    units = dispatch(ctx, [], UNIT)
    for unit in units:
        assert run_unit(ctx, unit.unit_id, generator, "w1").committed
    return [u.unit_id for u in units]


class Early:
    """The on_rows hook: dispatch and run what the first part allows, then note what the job looked like."""

    def __init__(self, ctx, then=None):
        self.ctx, self.then, self.units, self.seen = ctx, then, [], None

    def __call__(self) -> None:
        self.units = _dispatch_and_run(self.ctx)
        with self.ctx.sessions() as session:
            job = session.scalars(select(Job)).one()
            done = session.scalar(select(func.count()).select_from(Request).where(
                Request.status == RequestStatus.COMPLETED))
            self.seen = (job.status, job.completed, done)
        if self.then is not None:
            self.then(job.id)


def _requests(ctx, job_id: str) -> int:
    with ctx.sessions() as session:
        return session.scalar(select(func.count()).select_from(Request).where(Request.job_id == job_id))


def test_units_run_before_the_queue_move_and_the_job_completes_with_each_custom_id_once(ctx):
    job_id = _create(ctx, _lines(N))
    early = Early(ctx)
    job = validate_job(ctx, job_id, on_rows=early)
    status, completed, done = early.seen
    # only full units of the first part ran, while the job was still validating; their counts already added
    assert early.units and status == JobStatus.VALIDATING and 0 < done < 1000 and completed == done
    assert job.status == JobStatus.IN_PROGRESS and job.in_progress_at is not None  # straight on from the queue move
    _dispatch_and_run(ctx)
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
        units = session.scalar(select(func.count()).select_from(WorkUnit))
    assert job.status == JobStatus.COMPLETED and job.completed == N and job.failed == 0 and job.total == N
    output = read_output(ctx, job_id)
    assert Counter(line["custom_id"] for line in output) == Counter(f"c{i}" for i in range(N))
    assert units > len(early.units)


def test_a_duplicate_custom_id_on_the_last_line_after_units_ran_fails_the_job_with_no_output_and_zero_counts(ctx):
    job_id = _create(ctx, _lines(N, last=chat_line("c0", "again", max_tokens=1)))
    early = Early(ctx)
    job = validate_job(ctx, job_id, on_rows=early)
    assert early.seen[0] == JobStatus.VALIDATING and early.seen[2] > 0  # units ran and counted before the last line
    assert job.status == JobStatus.FAILED and job.output_key is None
    assert (job.completed, job.prompt_tokens, job.completion_tokens, job.cached_tokens) == (0, 0, 0, 0)
    assert job.failed == job.invalid and _requests(ctx, job_id) == 0
    errors = read_output(ctx, job_id, errors=True)  # its bad lines are its error file
    assert errors and all(e["custom_id"] == "c0" for e in errors)
    _dispatch_and_run(ctx)  # nothing of it is planned again
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    assert job.status == JobStatus.FAILED and job.completed == 0


def test_a_cancel_of_a_validating_job_after_units_ran_ends_it_cancelled_with_nothing_counted(ctx):
    job_id = _create(ctx, _lines(N))
    early = Early(ctx, then=lambda job_id: service.cancel(ctx, job_id))
    job = validate_job(ctx, job_id, on_rows=early)
    assert early.seen[0] == JobStatus.VALIDATING and early.seen[2] > 0
    assert job.status == JobStatus.CANCELLED
    assert (job.completed, job.failed, job.prompt_tokens, job.completion_tokens) == (0, 0, 0, 0)
    assert _requests(ctx, job_id) == 0 and read_output(ctx, job_id) == []


def test_a_validation_rerun_after_units_ran_starts_clean_and_the_job_completes_with_each_custom_id_once(ctx):
    """A crashed validation's rows (some already run by streamed units) are dropped by the rerun, counts too."""
    job_id = _create(ctx, _lines(N))

    def rerun(job_id: str) -> None:  # another run takes the job over: this one stops at its next commit
        assert validate_job(ctx, job_id).status == JobStatus.QUEUED

    early = Early(ctx, then=rerun)
    job = validate_job(ctx, job_id, on_rows=early)
    assert early.seen[2] > 0 and job.status == JobStatus.QUEUED and job.completed == 0
    _dispatch_and_run(ctx)
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    assert job.status == JobStatus.COMPLETED and job.completed == N and job.failed == 0
    output = read_output(ctx, job_id)
    assert Counter(line["custom_id"] for line in output) == Counter(f"c{i}" for i in range(N))


def test_without_the_setting_nothing_of_a_validating_job_is_planned(make_context, postgres_url, tiny_model):
    ctx = make_context(database_url=postgres_url, model=tiny_model, engine="null", stream_dispatch=False)
    job_id = _create(ctx, _lines(N))
    planned = []
    job = validate_job(ctx, job_id, on_rows=lambda: planned.append(dispatch(ctx, [], UNIT)))
    assert planned == [] and job.status == JobStatus.QUEUED and job.completed == 0
