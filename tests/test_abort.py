"""Cancel and expiry stop the engine: a running unit's requests of a cancelled (or expired) job stop within
its next poll, go to the error file as batch_cancelled (batch_expired) and end the job, while another job's
requests in the same unit run to the end. On a real worker, and in the embedded mode with the cancel sent
from a second process."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import select, update

from batchinfer.db.models import Job, Request, WorkUnit
from batchinfer.jobs import service
from batchinfer.settings import Settings
from cli_helpers import batchinfer, cli_env, wait_for
from jobfiles import completion_line, read_output, submit_lines
from benchmarks.support.services import start_cli, stop
from batchinfer.cluster.registry import open_registry

LONG = 256  # counting never meets EOS: each request runs to max_tokens unless it is stopped


def counting(prefix: str, n: int, max_tokens: int = LONG) -> list[str]:
    return [completion_line(f"{prefix}{i}", ", ".join(str(k) for k in range(i, i + 6)) + ",", max_tokens=max_tokens)
            for i in range(n)]



def _wait(condition, what: str, timeout: float = 240.0, every: float = 0.05):
    return wait_for(condition, what, timeout, every)


def _statuses(ctx, job_id: str) -> set[str]:
    with ctx.sessions() as session:
        return set(session.scalars(select(Request.status).where(Request.job_id == job_id)))


def _in_order(job: Job, *names: str) -> bool:
    times = [getattr(job, n) for n in names]
    return all(t is not None for t in times) and times == sorted(times)


@pytest.fixture
def worker_env(tmp_path, model_cache, postgres_url, s3_url, redis_server, s3_server):
    # a short TTL: the sweep dispatches the jobs this test queues in-process (no dispatch message) after it
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url, BATCHINFER_STORAGE_URL=s3_url,
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_WORKER_TTL_S="4", BATCHINFER_SWEEP_INTERVAL_S="1", **s3_server)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    name = f"w{uuid.uuid4().hex[:6]}"
    worker = start_cli(env, tmp_path / "worker.log", "worker", "--name", name)
    settings = Settings(broker_url=env["BATCHINFER_BROKER_URL"], broker_prefix=env["BATCHINFER_BROKER_PREFIX"])
    try:
        _wait(lambda: name in {w.name for w in open_registry(settings).live()} or worker.poll() is not None, "the worker", every=1)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        yield env
    finally:
        stop(worker)


def test_cancel_and_expiry_stop_their_requests_while_the_shared_unit_goes_on(worker_env, make_context, postgres_url,
                                                                               s3_url):
    ctx = make_context(database_url=postgres_url, storage_url=s3_url)
    cancelled = submit_lines(ctx, counting("c", 2))
    expiring = submit_lines(ctx, counting("x", 2))
    kept = submit_lines(ctx, counting("k", 1, max_tokens=160))  # outlasts the cancel and the expiry
    jobs = (cancelled.id, expiring.id, kept.id)
    _wait(lambda: all(_statuses(ctx, j) == {"running"} for j in jobs), "the unit to start")
    with ctx.sessions() as session:
        units = set(session.scalars(select(Request.unit_id).where(Request.job_id.in_(jobs)).distinct()))
    assert len(units) == 1, "the three jobs were meant to share one unit"
    unit_id = units.pop()

    started = time.time()
    service.cancel(ctx, cancelled.id)
    with ctx.sessions() as session, session.begin():  # the completion window passes (we cannot wait a day)
        session.execute(update(Job).where(Job.id == expiring.id).values(expires_at=time.time()))
    ended: dict[str, float] = {}

    def both_ended() -> bool:
        for job_id, final in ((cancelled.id, "cancelled"), (expiring.id, "expired")):
            if job_id not in ended and service.get(ctx, job_id).status == final:
                ended[job_id] = time.time() - started
        return len(ended) == 2

    _wait(both_ended, "the cancel and the expiry to end their jobs", 60)
    print(f"cancel -> job cancelled in {ended[cancelled.id]:.2f} s; expiry -> job expired in {ended[expiring.id]:.2f} s")

    _wait(lambda: service.get(ctx, kept.id).status == "completed", "the other job to complete")
    job = service.get(ctx, kept.id)
    assert (job.completed, job.failed) == (1, 0)
    assert [len(o["response"]["body"]["choices"][0]["text"]) > 0 for o in read_output(ctx, kept.id)] == [True]
    with ctx.sessions() as session:
        unit_done_at = session.get(WorkUnit, unit_id).finished_at
    # neither waited for the unit: both jobs ended while the other job's request still ran
    assert service.get(ctx, cancelled.id).cancelled_at < unit_done_at
    assert service.get(ctx, expiring.id).expired_at < unit_done_at
    for job_id, status, code in ((cancelled.id, "cancelled", "batch_cancelled"), (expiring.id, "expired", "batch_expired")):
        job = service.get(ctx, job_id)
        assert (job.completed, job.failed, job.completion_tokens) == (0, 2, 0)  # partial output is not counted
        assert read_output(ctx, job_id) == []
        assert [e["error"]["code"] for e in read_output(ctx, job_id, errors=True)] == [code] * 2
        assert _statuses(ctx, job_id) == {status}
    assert _in_order(service.get(ctx, cancelled.id), "in_progress_at", "cancelling_at", "finalizing_at", "cancelled_at")
    assert _in_order(service.get(ctx, expiring.id), "in_progress_at", "finalizing_at", "expired_at")


def test_embedded_cancel_from_a_second_process_stops_the_run(tmp_path, model_cache, make_context):
    env = cli_env(tmp_path, model_cache)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(counting("c", 3)) + "\n")
    out = open(tmp_path / "submit.out", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", "submit", str(src)], env=env, stdout=out,
                            stderr=open(tmp_path / "submit.err", "wb"), start_new_session=True)
    try:
        job_id = _wait(lambda: (tmp_path / "submit.out").read_text().strip() or proc.poll() is not None,
                       "the job id, printed as soon as the job exists", 120)
        assert isinstance(job_id, str) and job_id.startswith("batch_"), (tmp_path / "submit.err").read_text()
        ctx = make_context()  # the same data dir: the same SQLite database
        _wait(lambda: _statuses(ctx, job_id) == {"running"}, "the run to start", 180)
        cancel = batchinfer(env, "cancel", job_id)
        assert cancel.returncode == 0 and cancel.stdout.split() == [job_id, "cancelling"], cancel.stderr
        started = time.time()
        assert proc.wait(120) == 0, (tmp_path / "submit.err").read_text()
        print(f"embedded: cancel returned -> submit exited in {time.time() - started:.2f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        out.close()
    assert (tmp_path / "submit.out").read_text().split() == [job_id]  # the id once, at the start
    assert f"{job_id} cancelled: 0 completed, 3 failed" in (tmp_path / "submit.err").read_text()
    job = service.get(ctx, job_id)
    assert job.status == "cancelled" and _in_order(job, "in_progress_at", "cancelling_at", "cancelled_at")
    assert [e["error"]["code"] for e in read_output(ctx, job_id, errors=True)] == ["batch_cancelled"] * 3
