"""The control plane in `batchinfer serve` (runtime.control_plane) on a real PostgreSQL and Redis: two servers
sweeping at once do each thing once. (The zero-worker cases with real processes: tests/faults/test_fault_fleets.py.)"""
from __future__ import annotations

import threading
import uuid

import pytest
import redis
from sqlalchemy import select

from batchinfer.cluster.registry import WorkerRegistry
from batchinfer.db.models import JobStatus, UnitStatus, WorkUnit
from batchinfer.jobs import service
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.state import units
from batchinfer.runtime.control_plane import ControlPlane
from jobfiles import completion_line, submit_lines


class RecordingSender:
    """The broker's side of the sweep's hooks, recorded (what a server sends, counted; the sends themselves are
    Celery's, covered by the end-to-end cases)."""

    def __init__(self):
        self.units: list[str] = []
        self.lock = threading.Lock()

    def unit(self, unit_id, queue, level=None, priority=None):
        with self.lock:
            self.units.append(unit_id)

    def dispatch(self, round_no=0, countdown=None):
        pass

    def validation(self, job_id):
        pass


@pytest.fixture
def cluster(make_context, postgres_url, redis_server):
    prefix = f"cp-{uuid.uuid4().hex[:8]}:"
    # a long TTL: the grace before a queued unit with no broker message (this sender sends none) is sent again
    ctx = make_context(database_url=postgres_url, broker_url=f"{redis_server}/0", broker_prefix=prefix,
                       worker_ttl_s=30, sweep_interval_s=0.2, webhook_secret="whsec_test", webhook_poll_s=3600)
    conn = redis.Redis.from_url(redis_server)
    yield ctx, conn, prefix
    for key in conn.scan_iter(match=prefix + "*"):
        conn.delete(key)


def test_two_servers_sweeping_at_once_rerun_a_lost_unit_once_and_expire_a_job_once(cluster):
    ctx, conn, prefix = cluster
    lost_job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(2)])
    lost = sorted(u.unit_id for u in dispatch(ctx))
    for unit_id in lost:  # started by a worker that is gone
        assert units.start_unit(ctx, unit_id, "gone", "inc-1") is not None
    overdue = submit_lines(ctx, [completion_line("a", "Hello")], completion_window="1s")
    sender = RecordingSender()
    planes = [ControlPlane(ctx, sender, WorkerRegistry(conn, key_prefix=prefix, ttl_s=0.5)) for _ in range(2)]
    rounds = threading.Barrier(2)

    def sweep_often(plane: ControlPlane) -> None:
        for _ in range(15):
            rounds.wait()  # both ticks at the same moment, each round
            plane.tick()
            threading.Event().wait(0.1)

    threads = [threading.Thread(target=sweep_often, args=(p,)) for p in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sender.units) == lost  # each lost unit sent again once, by one of the two
    with ctx.sessions() as session:
        assert {(u.status, u.attempts) for u in session.scalars(select(WorkUnit).where(WorkUnit.id.in_(lost)))} == \
            {(UnitStatus.QUEUED, 1)}
    job = service.get(ctx, overdue.id)
    assert (job.status, job.failed, job.total) == (JobStatus.EXPIRED, 1, 1)  # its request expired and counted once
    assert service.get(ctx, lost_job.id).status == JobStatus.IN_PROGRESS
