"""Worker faults: SIGKILL mid-unit (with a peer, alone and restarted, during a cancel), a unit delivered
twice, a cold shutdown mid-unit, cancel and expiry racing a running unit, and one bad seed among others."""
from __future__ import annotations

import json
import signal
import time

from sqlalchemy import update

from batchinfer.db.models import Job
from batchinfer.jobs import service
from faultlib import job_lines, record_recovery, slow_lines, wait_for


def test_sigkill_mid_unit_with_a_second_worker_reruns_it_there(fault_cluster):
    c = fault_cluster()
    c.start("w1", "w2")
    lines = slow_lines("k", 8)
    job_id = c.submit(lines)
    victim = c.wait_unit_running()
    killed_at = c.kill(victim.worker)
    job = c.wait_final(job_id)
    c.check(job, lines, "completed", expect_completed=8)
    rerun = {u.id: u for u in c.units()}[victim.id]
    assert rerun.attempts >= 2 and rerun.worker != victim.worker, (rerun.attempts, rerun.worker)
    record_recovery("sigkill mid-unit, second worker", rerun.finished_at - killed_at)


def test_the_only_worker_sigkilled_and_restarted_under_its_name_reruns_its_unit(fault_cluster):
    c = fault_cluster()
    c.start("w1")
    lines = slow_lines("r", 6)
    job_id = c.submit(lines)
    victim = c.wait_unit_running("w1")
    killed_at = c.kill("w1")
    c.start("w1")  # what systemd or Kubernetes do: same name, new process
    back_at = time.time()
    job = c.wait_final(job_id)
    c.check(job, lines, "completed", expect_completed=6)
    rerun = {u.id: u for u in c.units()}[victim.id]
    assert rerun.attempts >= 2 and rerun.incarnation != victim.incarnation
    record_recovery("only worker sigkilled, restarted same name", rerun.finished_at - back_at,
                    including_restart_s=round(rerun.finished_at - killed_at, 2))


def test_sigkill_during_a_cancel_ends_cancelled(fault_cluster):
    c = fault_cluster()
    c.start("w1", "w2")
    lines = slow_lines("c", 8)
    job_id = c.submit(lines)
    victim = c.wait_unit_running()
    service.cancel(c.context(), job_id)
    killed_at = c.kill(victim.worker)
    job = c.wait_final(job_id)
    outputs, errors = c.check(job, lines, "cancelled")
    assert {e["error"]["code"] for e in errors} <= {"batch_cancelled"} and errors
    record_recovery("sigkill during a cancel", job.cancelled_at - killed_at)


def test_the_same_unit_delivered_twice_counts_once(fault_cluster):
    from batchinfer.jobs.dispatch.routing import SHARED_QUEUE
    from workers.celery_app import make_app
    from workers.tasks import RUN_UNIT_TASK

    c = fault_cluster()
    c.start("w1", "w2")
    lines = job_lines("d", 6)
    started = time.time()
    job_id = c.submit(lines)
    units = wait_for(lambda: c.units(), 60, "the dispatch")
    app = make_app(c.settings)
    for unit in units:  # a second message for every unit, as a broker redelivery would send
        app.send_task(RUN_UNIT_TASK, args=[unit.id], queue=SHARED_QUEUE)
    job = c.wait_final(job_id)
    c.check(job, lines, "completed", expect_completed=6)
    record_recovery("same unit delivered twice (time to completion)", job.completed_at - started)


def test_a_cold_shutdown_mid_unit_reruns_the_unit_instead_of_failing_it(fault_cluster):
    c = fault_cluster()
    c.start("w1")
    lines = slow_lines("q", 6)
    job_id = c.submit(lines)
    victim = c.wait_unit_running("w1")
    c.signal("w1", signal.SIGTERM)  # warm shutdown, then cold: what `docker stop` and a second Ctrl-C do
    time.sleep(0.05)
    c.signal("w1", signal.SIGQUIT)
    stopped_at = time.time()
    c.procs["w1"].wait(60)
    after = {u.id: u for u in c.units()}[victim.id]
    assert after.status != "done" or after.attempts > 1 or service.get(c.context(), job_id).failed == 0
    c.start("w1")
    job = c.wait_final(job_id)
    c.check(job, lines, "completed", expect_completed=6)  # nothing failed with server_error
    record_recovery("cold shutdown mid-unit, restarted", job.completed_at - stopped_at)


def test_cancel_and_expiry_racing_a_running_unit(fault_cluster):
    c = fault_cluster()
    c.start("w1")
    cancel_lines, expire_lines = slow_lines("x", 6), slow_lines("e", 6)
    cancel_id = c.submit(cancel_lines)
    expire_id = c.submit(expire_lines)
    c.wait_unit_running("w1")
    raced_at = time.time()
    service.cancel(c.context(), cancel_id)
    with c.context().sessions.begin() as session:  # its completion window ends now (the clock, moved on)
        session.execute(update(Job).where(Job.id == expire_id).values(expires_at=raced_at - 1))
    cancelled, expired = c.wait_final(cancel_id), c.wait_final(expire_id)
    _, errors = c.check(cancelled, cancel_lines, "cancelled")
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    _, errors = c.check(expired, expire_lines, "expired")
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    record_recovery("cancel and expiry racing a running unit", max(cancelled.cancelled_at, expired.expired_at) - raced_at)


def test_a_seed_overflow_fails_only_its_own_line_not_another_jobs_requests(fault_cluster):
    c = fault_cluster(BATCHINFER_MAX_REQUESTS_PER_UNIT="8")
    c.start("w1")
    body = {"model": "smollm2-135m-instruct", "prompt": "Shared prompt for both jobs:", "max_tokens": 2,
            "temperature": 0.7}
    bad_job = [json.dumps({"custom_id": f"s-{i}", "method": "POST", "url": "/v1/completions",
                           "body": {**body, "seed": 2 ** 64 if i == 1 else i}}) for i in range(3)]
    other_job = [json.dumps({"custom_id": f"o-{i}", "method": "POST", "url": "/v1/completions",
                             "body": {**body, "seed": i}}) for i in range(3)]
    started = time.time()
    bad_id = service.submit(c.context(), _io(bad_job), "bad.jsonl", skip_invalid=True).id
    other_id = c.submit(other_job)  # one dispatch plans both jobs: same prompt, same unit
    bad, other = c.wait_final(bad_id), c.wait_final(other_id)
    c.check(other, other_job, "completed", expect_completed=3)
    _, errors = c.check(bad, bad_job, "completed", expect_completed=2)
    assert [e["custom_id"] for e in errors] == ["s-1"] and "seed" in errors[0]["error"]["message"]
    record_recovery("seed overflow mixed into another job's unit (time to completion)",
                    max(bad.completed_at, other.completed_at) - started)


def _io(lines: list[str]):
    import io

    return io.BytesIO(("\n".join(lines) + "\n").encode())
