"""The sweep on a real Redis registry and a real database: what it reruns, resends, fails and finishes."""
from __future__ import annotations

import time
import uuid

import pytest
import redis
from sqlalchemy import select, update

from batchinfer.cluster.registry import WorkerRegistry, WorkerState
from batchinfer.cluster.sweep import SweepHooks, sweep
from batchinfer.db.models import Job, JobStatus, Request, UnitStatus, WorkUnit
from batchinfer.jobs import service
from batchinfer.jobs.state import units
from batchinfer.jobs.units import runner as unit_runner
from batchinfer.jobs.dispatch.planning import dispatch
from jobfiles import completion_line, read_output, submit_lines


@pytest.fixture
def setup(make_context, redis_server):
    conn = redis.Redis.from_url(redis_server)
    prefix = f"sweep-{uuid.uuid4().hex[:8]}:"
    registry = WorkerRegistry(conn, key_prefix=prefix, ttl_s=0.5)
    ctx = make_context(worker_ttl_s=0.5, unit_max_attempts=3)
    sent: list[str] = []
    hooks = SweepHooks(requeue=sent.append, fail=lambda u, cause: unit_runner.fail_unit(ctx, u, cause).committed,
                       dispatch=lambda: sent.append("dispatch"))
    yield ctx, registry, hooks, sent
    for key in conn.scan_iter(match=prefix + "*"):
        conn.delete(key)


def _running_unit(ctx, registry, worker="w1", incarnation="inc-1", publish=True):
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(2)])
    (unit,) = dispatch(ctx)
    if publish:
        registry.beat(WorkerState(worker, incarnation=incarnation, busy=True, unit_id=unit.unit_id))
    assert units.start_unit(ctx, unit.unit_id, worker, incarnation) is not None
    return job, unit.unit_id


def _after_grace(ctx) -> float:
    """A sweep's `now` past the grace a queued unit or a queued job's dispatch gets (worker_ttl_s)."""
    return time.time() + 2 * ctx.settings.worker_ttl_s


def _unit(ctx, unit_id):
    with ctx.sessions() as session:
        return session.get(WorkUnit, unit_id)


def test_a_unit_its_live_worker_runs_is_left_alone(setup):
    ctx, registry, hooks, sent = setup
    _, unit_id = _running_unit(ctx, registry)
    done = sweep(ctx, registry, hooks)
    assert done.rerun == [] and sent == [] and _unit(ctx, unit_id).status == UnitStatus.RUNNING


def test_a_unit_of_a_dead_worker_is_rerun_once(setup):
    ctx, registry, hooks, sent = setup
    _, unit_id = _running_unit(ctx, registry)
    registry.go_silent("w1")  # it stopped beating (its key expiring is the registry's own test)
    assert sweep(ctx, registry, hooks).rerun == [unit_id] and sent == [unit_id]
    assert _unit(ctx, unit_id).status == UnitStatus.QUEUED
    sent.clear()
    registry.beat(WorkerState("w2"))
    assert sweep(ctx, registry, hooks).rerun == []  # its message is the one just sent: no second rerun


def test_a_worker_restarted_under_the_same_name_gets_its_lost_unit_rerun(setup):
    ctx, registry, hooks, sent = setup
    _, unit_id = _running_unit(ctx, registry)
    registry.beat(WorkerState("w1", incarnation="inc-2"))  # same name, new process, first beat
    assert sweep(ctx, registry, hooks).rerun == [unit_id] and sent == [unit_id]


def test_a_unit_a_live_worker_no_longer_runs_is_rerun(setup):
    ctx, registry, hooks, sent = setup
    _, unit_id = _running_unit(ctx, registry)
    registry.beat(WorkerState("w1", incarnation="inc-1", busy=False, unit_id=None))  # its task raised
    assert sweep(ctx, registry, hooks).rerun == [unit_id]


def test_a_queued_unit_whose_message_redis_lost_is_sent_again(setup):
    ctx, registry, hooks, sent = setup
    submit_lines(ctx, [completion_line("a", "Hello")])
    (unit,) = dispatch(ctx)
    assert sweep(ctx, registry, hooks).resent == []  # within the grace period its message may be on its way
    assert sweep(ctx, registry, hooks, now=_after_grace(ctx)).resent == [unit.unit_id] and sent == [unit.unit_id]


def test_queued_units_of_a_dispatch_still_in_progress_are_not_sent_twice(setup):
    """Planning 50,000 requests under load outlasted the grace: the sweep sent 229 units a second time while
    their dispatcher was still sending them. A live holder of the dispatch lock now defers the check."""
    ctx, fast, hooks, sent = setup
    registry = WorkerRegistry(fast.conn, key_prefix=fast.key_prefix, ttl_s=60)  # the holder stays live however slow this runs
    submit_lines(ctx, [completion_line("a", "Hello")])
    (unit,) = dispatch(ctx)
    registry.beat(WorkerState("w1", incarnation="inc-dispatching"))
    registry.conn.set(registry.dispatch_key(), "inc-dispatching")
    assert sweep(ctx, registry, hooks, now=_after_grace(ctx)).resent == [] and sent == []
    registry.conn.set(registry.dispatch_key(), "inc-of-a-dead-worker")  # its holder died mid-dispatch
    assert sweep(ctx, registry, hooks, now=_after_grace(ctx)).resent == [unit.unit_id]


def test_pending_requests_nobody_dispatched_get_dispatched(setup):
    ctx, registry, hooks, sent = setup
    submit_lines(ctx, [completion_line("a", "Hello")])
    assert sweep(ctx, registry, hooks, now=_after_grace(ctx)).dispatched and sent == ["dispatch"]


def test_a_unit_lost_too_often_fails_its_requests_with_server_error_and_the_job_ends(setup):
    ctx, registry, hooks, sent = setup
    job, unit_id = _running_unit(ctx, registry, publish=False)
    with ctx.sessions.begin() as session:
        session.execute(update(WorkUnit).where(WorkUnit.id == unit_id).values(attempts=3))
    done = sweep(ctx, registry, hooks)
    assert done.failed == [unit_id] and sent == []
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == (JobStatus.COMPLETED, 0, 2)
    errors = read_output(ctx, job.id, errors=True)
    assert [e["custom_id"] for e in errors] == ["c0", "c1"]
    assert {e["error"]["code"] for e in errors} == {"server_error"} and "stopped beating" in errors[0]["error"]["message"]


def test_a_cancelled_job_whose_unit_was_lost_ends_cancelled(setup):
    ctx, registry, hooks, sent = setup
    job, unit_id = _running_unit(ctx, registry, publish=False)
    service.cancel(ctx, job.id)
    assert service.get(ctx, job.id).status == JobStatus.CANCELLING  # its unit is marked running
    sweep(ctx, registry, hooks)  # the unit is rerun (nobody runs it), then its requests are cancelled
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == (JobStatus.CANCELLED, 0, 2)
    assert [e["error"]["code"] for e in read_output(ctx, job.id, errors=True)] == ["batch_cancelled"] * 2


def test_a_failed_finalize_is_retried_after_its_backoff(setup):
    ctx, registry, hooks, sent = setup
    job = submit_lines(ctx, [completion_line("a", "Hello")])
    with ctx.sessions.begin() as session:  # as a finalize that died or failed leaves it
        session.execute(update(Request).where(Request.job_id == job.id).values(status="cancelled"))
        session.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.FINALIZING,
                                                                   finalize_after=time.time() + 60))
    assert sweep(ctx, registry, hooks).jobs.finalized == []  # not before its backoff
    with ctx.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job.id).values(finalize_after=time.time() - 1))
    assert sweep(ctx, registry, hooks).jobs.finalized == [job.id]
    assert service.get(ctx, job.id).status == JobStatus.COMPLETED


def test_an_overdue_job_is_expired_by_the_sweep(setup):
    ctx, registry, hooks, sent = setup
    job = submit_lines(ctx, [completion_line("a", "Hello")], completion_window="1s")
    assert sweep(ctx, registry, hooks, now=job.expires_at + 0.1).jobs.expired == [job.id]
    assert service.get(ctx, job.id).status == JobStatus.EXPIRED
    with ctx.sessions() as session:
        assert session.scalar(select(Request.status).where(Request.job_id == job.id)) == "expired"


def test_a_dispatch_that_cannot_take_the_lock_in_time_leaves_the_work_to_the_sweep(make_context, redis_server,
                                                                                  monkeypatch):
    """50 submits at once kept one dispatcher planning past the others' lock wait; each waiter then raised
    LockError with a traceback. Now it skips: the holder plans what is pending, the sweep the rest."""
    from batchinfer.cluster.registry import open_registry
    from batchinfer.runtime.commands.dispatch_round import DispatchRound
    from workers.tasks import SEND

    ctx = make_context(broker_url=f"{redis_server}/0", broker_prefix=f"lock-{uuid.uuid4().hex[:8]}:")
    job = submit_lines(ctx, [completion_line("a", "x")])
    holder = open_registry(ctx.settings).dispatch_lock()
    assert holder.acquire(blocking=False)
    # the real lock and Redis; only the wait is shortened from 120 s
    real_lock = WorkerRegistry.dispatch_lock
    monkeypatch.setattr(WorkerRegistry, "dispatch_lock", lambda self, wait_s=120.0: real_lock(self, 0.2))
    try:
        assert DispatchRound(ctx, SEND).run() == 0
    finally:
        holder.release()
    with ctx.sessions() as session:
        assert set(session.scalars(select(Request.status).where(Request.job_id == job.id))) == {"pending"}


def test_a_unit_released_for_an_outage_is_sent_again_once_its_service_answers_and_never_failed_for_it(setup):
    """Released while storage was down (jobs.outage): its requests go back to planned, and the run is not a
    failure: with attempts at the limit it is still sent again (storage answers here), not failed."""
    ctx, registry, hooks, sent = setup
    job, unit_id = _running_unit(ctx, registry, publish=False)
    with ctx.sessions.begin() as session:
        session.execute(update(WorkUnit).where(WorkUnit.id == unit_id).values(attempts=3))
    assert units.release_unit(ctx, unit_id, 3, "storage", "waiting for storage: EndpointConnectionError")
    assert not units.release_unit(ctx, unit_id, 3, "storage", "again")  # only the run that owns the unit
    unit = _unit(ctx, unit_id)
    assert (unit.status, unit.waiting_for, unit.outage_releases) == (UnitStatus.QUEUED, "storage", 1)
    with ctx.sessions() as session:
        assert set(session.scalars(select(Request.status).where(Request.job_id == job.id))) == {"planned"}
    assert service.get(ctx, job.id).status == JobStatus.IN_PROGRESS
    done = sweep(ctx, registry, hooks)
    assert done.resent == [unit_id] and sent == [unit_id] and done.failed == []
    assert units.start_unit(ctx, unit_id, "w1", "inc-1").attempt == 4 and _unit(ctx, unit_id).waiting_for is None


def test_a_release_the_database_could_not_take_is_made_by_the_sweep_from_the_brokers_note(setup):
    """The database was down when the run gave up: it left a note in Redis; once the database answers the
    sweep releases the unit from it (not a rerun of a lost unit: nothing counts as a failure)."""
    ctx, registry, hooks, sent = setup
    _, unit_id = _running_unit(ctx, registry)
    registry.beat(WorkerState("w1", incarnation="inc-1"))  # alive, running nothing: its run gave up
    registry.note_released(unit_id, 1, "database")
    done = sweep(ctx, registry, hooks)
    unit = _unit(ctx, unit_id)
    assert done.rerun == [] and (unit.outage_releases, unit.attempts) == (1, 1)
    assert registry.released(unit_id) is None  # the note is used once
    assert unit_id in sent  # and the database answers: sent again in the same pass


def test_an_expired_job_whose_unit_waits_for_an_outage_expires_its_unfinished_requests(setup):
    ctx, registry, hooks, sent = setup
    job, unit_id = _running_unit(ctx, registry, publish=False)
    assert units.release_unit(ctx, unit_id, 1, "storage", "waiting for storage")
    sweep(ctx, registry, hooks, now=job.expires_at + 0.1)
    job = service.get(ctx, job.id)
    assert (job.status, job.failed) == (JobStatus.EXPIRED, 2)
    assert {e["error"]["code"] for e in read_output(ctx, job.id, errors=True)} == {"batch_expired"}
