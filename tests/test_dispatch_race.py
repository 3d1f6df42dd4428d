"""Two dispatchers at once never lose or duplicate a request, and the sweep heals a request no live unit holds
(real PostgreSQL, real Redis, the null engine: issue 22's 50,000 run ended with one request `planned` in no unit
after its 705 s dispatch outlived the dispatch lock and the sweep dispatched beside it)."""
from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError

from batchinfer.cluster.registry import WorkerRegistry
from batchinfer.cluster.sweep import SweepHooks, sweep
from batchinfer.db.models import JobStatus, Request, RequestStatus, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.jobs import service
from batchinfer.jobs.records import RequestKey, UnitRequest
from batchinfer.planner import PlannerConfig
from batchinfer.jobs.dispatch import planning as dispatch_module
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.null_generator import NullGenerator
from batchinfer.jobs.units.runner import run_unit
from jobfiles import chat_line, read_output, submit_lines

UNIT = PlannerConfig(max_requests_per_unit=64)


@pytest.fixture
def ctx(make_context, postgres_url, tiny_model):
    return make_context(database_url=postgres_url, model=tiny_model, engine="null", worker_ttl_s=0.5)


def _lines(n: int) -> list[str]:
    return [chat_line(f"c{i}", f"question {i % 97}") for i in range(n)]


def _run_all(ctx, unit_ids, generator=None) -> None:
    generator = generator or NullGenerator.from_settings(ctx.settings)
    for unit_id in unit_ids:
        assert run_unit(ctx, unit_id, generator, "w1").committed


def _assert_each_request_in_one_unit_at_its_place(ctx, job_id: str, n: int) -> list[str]:
    """Every request planned in one unit, at the position its unit's input holds it; returns the unit ids."""
    with ctx.sessions() as session:
        rows = session.execute(select(Request.index, Request.status, Request.unit_id, Request.unit_pos)
                               .where(Request.job_id == job_id)).all()
        sizes = dict(session.execute(select(WorkUnit.id, WorkUnit.num_requests)).all())
    assert len(rows) == n and {r.status for r in rows} == {RequestStatus.PLANNED}
    assert all(r.unit_id is not None and r.unit_pos is not None for r in rows)
    assert Counter(r.unit_id for r in rows) == Counter(sizes)  # each unit holds what it counts, no empty unit
    inputs = {}
    for unit_id in sizes:
        with ctx.storage.open_read(f"units/{unit_id}/input.jsonl") as stream:
            inputs[unit_id] = [UnitRequest.from_json(raw).key for raw in stream]
    assert all(inputs[r.unit_id][r.unit_pos] == RequestKey(job_id, r.index) for r in rows)
    return sorted(sizes)


def test_two_dispatchers_planning_the_same_snapshot_put_each_request_in_exactly_one_unit(ctx, monkeypatch):
    n = 3000
    job = submit_lines(ctx, _lines(n))
    barrier = threading.Barrier(2, timeout=120)
    real = dispatch_module._load_prepared

    def same_snapshot(ctx_, pending):
        found = real(ctx_, pending)
        barrier.wait()  # both planned every request: each one is claimed by two dispatchers at once
        return found

    monkeypatch.setattr(dispatch_module, "_load_prepared", same_snapshot)
    # claims of 2 units at a time: ~24 claim rounds each, so both usually win some; one may still win every round
    # (a fresh clone's run: the other, correctly, planned nothing). The barrier is what makes the race: both had
    # planned every request before either claimed one (a dispatcher that never got there breaks it: 120 s, an error).
    monkeypatch.setattr(dispatch_module, "UNITS_PER_COMMIT", 2)
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: dispatch(ctx, [], UNIT), range(2))
    assert sum(u.num_requests for u in first + second) == n
    unit_ids = _assert_each_request_in_one_unit_at_its_place(ctx, job.id, n)
    assert unit_ids == sorted(u.unit_id for u in first + second)
    assert dispatch(ctx, [], UNIT) == []
    _run_all(ctx, unit_ids)
    done = service.get(ctx, job.id)
    assert (done.status, done.completed, done.failed) == (JobStatus.COMPLETED, n, 0)
    out = Counter(o["custom_id"] for o in read_output(ctx, job.id))
    assert out == Counter(f"c{i}" for i in range(n))


def test_the_database_refuses_a_planned_request_in_no_unit(ctx):
    job = submit_lines(ctx, _lines(2))
    with pytest.raises(IntegrityError, match="ck_requests_open_has_unit"):
        with transaction(ctx.sessions) as session:
            session.execute(update(Request).where(Request.job_id == job.id, Request.index == 0)
                            .values(status=RequestStatus.PLANNED))


class _DropsOne(NullGenerator):
    """Answers all but the first request of a unit: its commit leaves that one running in a finished unit."""

    def generate(self, requests, on_result=None, aborts=None):
        requests = list(requests)
        return super().generate(requests, on_result, lambda: {requests[0].request_id})


def test_a_request_no_live_unit_holds_goes_back_to_pending_and_the_job_completes(ctx, redis_server):
    n = 200
    job = submit_lines(ctx, _lines(n))
    units = [u.unit_id for u in dispatch(ctx, [], UNIT)]
    assert len(units) == 4
    # (a) planned in no unit, as the 50,000 run left it (the constraint is dropped to plant it: a database
    # from before migration 0013, or a path not found yet); (b) running in a unit that committed without it
    with transaction(ctx.sessions) as session:
        session.execute(text("ALTER TABLE requests DROP CONSTRAINT ck_requests_open_has_unit"))
        session.execute(update(Request).where(Request.unit_id == units[0], Request.unit_pos == 5)
                        .values(unit_id=None, unit_pos=None))
    conn = redis.Redis.from_url(redis_server)
    registry = WorkerRegistry(conn, key_prefix=f"race-{uuid.uuid4().hex[:8]}:", ttl_s=0.5)
    dispatched: list[str] = []
    hooks = SweepHooks(requeue=lambda unit_id: None, fail=lambda unit_id, cause: False,
                       dispatch=lambda: dispatched.extend(u.unit_id for u in dispatch(ctx, [], UNIT)))
    later = time.time() + 2 * ctx.settings.worker_ttl_s
    assert sweep(ctx, registry, hooks, now=later).requeued == 0  # its other units are queued: not stalled
    generator = NullGenerator.from_settings(ctx.settings)
    _run_all(ctx, units[:1] + units[2:], generator)
    _run_all(ctx, units[1:2], _DropsOne(generator.tokenizer, generator.max_model_len))
    with ctx.sessions() as session:
        stuck = session.execute(select(Request.custom_id, Request.status).where(
            Request.job_id == job.id, Request.status.in_(RequestStatus.OPEN))).all()
    assert sorted(s for _, s in stuck) == ["planned", "running"]
    assert service.get(ctx, job.id).status == JobStatus.IN_PROGRESS  # nothing left to run it: stuck

    queued_at = service.get(ctx, job.id).queued_at
    assert sweep(ctx, registry, hooks, now=queued_at + 0.1).requeued == 0  # within the grace: left alone
    done = sweep(ctx, registry, hooks, now=time.time() + 2 * ctx.settings.worker_ttl_s)
    assert done.requeued == 2 and done.dispatched and len(dispatched) == 1
    _run_all(ctx, dispatched, generator)
    final = service.get(ctx, job.id)
    assert (final.status, final.completed, final.failed) == (JobStatus.COMPLETED, n, 0)
    out = Counter(o["custom_id"] for o in read_output(ctx, job.id))
    assert out == Counter(f"c{i}" for i in range(n))  # each once: the finished unit's file never had them
    for key in conn.scan_iter(match=registry.key_prefix + "*"):
        conn.delete(key)


class _Sender:
    """A dispatch round's sender that records what it is asked to send (no broker)."""

    def __init__(self, on_unit=None):
        self.sent: list[str] = []
        self.rounds: list[tuple[int, float | None]] = []
        self.on_unit = on_unit

    def unit(self, unit_id, queue, level=None, priority=None):
        self.sent.append(unit_id)
        if self.on_unit is not None:
            self.on_unit(unit_id)

    def dispatch(self, round_no=0, countdown=None):
        self.rounds.append((round_no, countdown))

    def validation(self, job_id):
        raise AssertionError("a dispatch round validates nothing")


def _round(ctx, sender, round_no=None, incarnation="inc-1"):
    """A dispatch round planning units of 4 requests on no worker (the unit shape the assertions count)."""
    from batchinfer.runtime.commands.dispatch_round import DispatchRound

    return DispatchRound(ctx, sender, incarnation, round_no, plan=lambda on_units, max_units: dispatch(
        ctx, [], PlannerConfig(max_requests_per_unit=4), on_units=on_units, max_units=max_units))


def test_a_dispatch_keeps_its_lock_while_it_runs_and_stops_once_another_holds_it(make_context, redis_server,
                                                                                monkeypatch, tiny_model):
    ctx = make_context(model=tiny_model, broker_url=f"{redis_server}/0", broker_prefix=f"lk-{uuid.uuid4().hex[:8]}:")
    submit_lines(ctx, _lines(40))
    key = WorkerRegistry(redis.Redis.from_url(redis_server), ctx.settings.broker_prefix).dispatch_key()
    real_lock = WorkerRegistry.dispatch_lock
    # the real lock on real Redis, with a 2 s timeout instead of 600 s; each batch of units takes 0.8 s to send, so
    # a batch's own writes have 1.2 s before the lock would expire (0.4 s was too little beside other tests)
    monkeypatch.setattr(WorkerRegistry, "dispatch_lock",
                        lambda self, wait_s=120.0: self.conn.lock(self.dispatch_key(), timeout=2, blocking_timeout=2))
    monkeypatch.setattr(dispatch_module, "UNITS_PER_COMMIT", 2)
    conn = redis.Redis.from_url(redis_server)
    seen: list[bytes | None] = []

    def slow_send(unit_id):
        if len(slow.sent) % 2:  # once a batch (2 units)
            time.sleep(0.8)
            seen.append(conn.get(key))

    slow = _Sender(slow_send)
    assert _round(ctx, slow).run() == 10  # 5 batches, 4 s: twice the lock's timeout
    assert seen == [b"inc-1"] * 5  # renewed at each batch, never lost
    monkeypatch.setattr(WorkerRegistry, "dispatch_lock", real_lock)

    second = submit_lines(ctx, _lines(40))

    def taken_over(unit_id):  # the lock expired and the sweep's dispatcher took it
        conn.set(key, "inc-2")

    assert _round(ctx, _Sender(taken_over)).run() == 2  # stops after the batch it sent
    assert conn.get(key) == b"inc-2"  # and leaves the new holder's lock alone
    conn.delete(key)
    with ctx.sessions() as session:
        statuses = Counter(session.scalars(select(Request.status).where(Request.job_id == second.id)))
    assert statuses == Counter({"pending": 32, "planned": 8})


def test_a_dispatch_task_runs_in_rounds_each_behind_the_units_it_sent(make_context, redis_server, monkeypatch,
                                                                      tiny_model):
    """Round 0 persists FIRST_ROUND_UNITS units and queues round 1, which persists ROUND_GROWTH times more; a
    round that leaves nothing pending queues none (the sweep's dispatch has no round: the whole plan)."""
    from batchinfer.jobs.dispatch import rounds

    ctx = make_context(model=tiny_model, broker_url=f"{redis_server}/0", broker_prefix=f"rd-{uuid.uuid4().hex[:8]}:")
    job = submit_lines(ctx, _lines(40))
    monkeypatch.setattr(rounds, "FIRST_ROUND_UNITS", 2)
    sender = _Sender()
    assert _round(ctx, sender, 0).run() == 2 and [r for r, _ in sender.rounds] == [1]
    with ctx.sessions() as session:
        assert Counter(session.scalars(select(Request.status))) == Counter({"planned": 8, "pending": 32})
    assert _round(ctx, sender, 1).run() == 8 and len(sender.rounds) == 1  # 8 units: the 32 left, nothing pending
    assert _round(ctx, sender, 2).run() == 0 and len(sender.rounds) == 1
    with ctx.sessions() as session:
        rows = session.execute(select(Request.status, Request.unit_id).where(Request.job_id == job.id)).all()
    assert {r.status for r in rows} == {"planned"} and Counter(r.unit_id for r in rows) == Counter(
        {u: 4 for u in sender.sent})


def test_a_round_chain_waits_for_rows_while_a_file_is_validated_and_one_chain_at_a_time(make_context, redis_server,
                                                                                         tiny_model):
    """A streamed file whose units keep up with its validation: a round finds nothing pending, and its chain must
    look again (it used to end, and nothing was dispatched until the queue move). One waiting chain at a time;
    once no file is validated, a round that sent nothing ends its chain."""
    from batchinfer.db.models import Job
    from batchinfer.jobs.dispatch.rounds import STREAM_WAIT_S

    ctx = make_context(model=tiny_model, broker_url=f"{redis_server}/0", broker_prefix=f"wt-{uuid.uuid4().hex[:8]}:",
                       stream_dispatch=True)
    job = submit_lines(ctx, _lines(40))
    sender = _Sender()
    assert _round(ctx, sender, 2).run() == 10 and sender.rounds == []  # all planned; the file is validated
    with ctx.sessions() as session, session.begin():  # as if its next rows were still being validated
        session.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.VALIDATING))
    assert _round(ctx, sender, 3).run() == 0 and sender.rounds == [(4, STREAM_WAIT_S)]
    assert _round(ctx, sender, 3).run() == 0 and len(sender.rounds) == 1  # a second chain ends: one waits
    time.sleep(STREAM_WAIT_S)
    with ctx.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.QUEUED))
    assert _round(ctx, sender, 4).run() == 0 and len(sender.rounds) == 1


def test_request_rows_written_by_copy_keep_their_custom_ids_exactly(ctx):
    """Validation writes a batch of rows with one COPY on PostgreSQL: tabs, newlines, backslashes, quotes and
    non-ASCII in a custom_id come back as they were sent."""
    odd = ["tab\there", "new\nline", "back\\slash\\N", "quote'\"", "ünï✓", "\\.", ""]
    job = submit_lines(ctx, [chat_line(c, "hi") for c in odd], skip_invalid=True)
    with ctx.sessions() as session:
        rows = session.execute(select(Request.index, Request.line, Request.custom_id, Request.status)
                               .where(Request.job_id == job.id).order_by(Request.index)).all()
    kept = [c for c in odd if c]  # an empty custom_id is an invalid line
    assert [r.custom_id for r in rows] == kept and {r.status for r in rows} == {"pending"}
    assert [r.line for r in rows] == [odd.index(c) + 1 for c in kept]


def test_a_copy_that_times_out_on_a_lock_is_a_fault_that_passes_and_each_row_is_written_once(ctx, postgres_server,
                                                                                             monkeypatch):
    """The COPY runs on psycopg's connection, under SQLAlchemy: its errors must still read as the database's
    faults (retried), not as a bad file (the job failed). A real lock timeout: another session holds the table."""
    import psycopg

    from batchinfer.jobs.state import intake as state

    real, held = state._insert, []

    def time_out_the_first(session, rows):
        if not held:
            admin = psycopg.connect(postgres_server.rsplit("/", 1)[0] + "/" + ctx.settings.database_url.rsplit("/", 1)[1])
            admin.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")  # its transaction stays open
            held.append(admin)
            threading.Timer(0.5, admin.close).start()  # the lock goes with it; a retry then gets through
            session.execute(text("SET LOCAL lock_timeout = '100ms'"))
        return real(session, rows)

    monkeypatch.setattr(state, "_insert", time_out_the_first)
    job = submit_lines(ctx, _lines(50))
    assert held and job.status == JobStatus.QUEUED
    with ctx.sessions() as session:
        assert Counter(session.scalars(select(Request.index).where(Request.job_id == job.id))) == Counter(range(50))
