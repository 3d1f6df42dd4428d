"""Outages never fail a request (issue 26): storage, the database or the broker down longer than a unit's
retry bound, then back; and storage down past the completion window. Each case checks that `status` says
what the batch waits for while the service is down, and records the recovery time after it returns.

The cases run scaled down (a retry bound of OUTAGE_RETRY_S, outages two to three times as long) so that
each outage outlasts the bound as the issue's 3- and 2-minute outages outlast the default one (60 s).
BATCHINFER_OUTAGE_FULL=1 runs them at full length: the default bound and botocore's retries, S3 down
3 minutes, PostgreSQL and Redis 2 minutes, a 2-minute completion window (about 15 minutes in all).
"""
from __future__ import annotations

import os
import time

from faultlib import record_recovery, slow_lines, wait_for

FULL = os.environ.get("BATCHINFER_OUTAGE_FULL") == "1"
OUTAGE_RETRY_S = 60.0 if FULL else 5.0
S3_DOWN_S = 180.0 if FULL else 15.0
DB_DOWN_S = 120.0 if FULL else 25.0  # past the bound plus the commit's own retries (about 16 s)
REDIS_DOWN_S = 120.0 if FULL else 15.0
WINDOW_S = 120 if FULL else 40


def outage_env(**extra: str) -> dict:
    env = {} if FULL else {"BATCHINFER_OUTAGE_RETRY_S": str(OUTAGE_RETRY_S), "BATCHINFER_OUTAGE_BACKOFF_S": "1"}
    return {**env, **extra}


def scaled_s3(c) -> None:
    if not FULL:  # botocore's 8 attempts take half a minute a call; 2 keep each try short, as the bound is
        c.s3_env = {**c.s3_env, "AWS_MAX_ATTEMPTS": "2"}


def status_says(c, job_id: str, *words: str, timeout: float = 90) -> str:
    """`batchinfer status` until its output names every word (it reads what the workers reported)."""
    def shows():
        done = c.cli("status", job_id)
        text = (done.stdout + done.stderr).lower()
        return text if all(w in text for w in words) else None
    return wait_for(shows, timeout, f"`status` to say {' '.join(words)}", every=1.0)


def outage_row(c, service: str):
    from batchinfer.db.models import ServiceOutage

    with c.context().sessions() as session:
        return session.get(ServiceOutage, service)


def released_units(c) -> int:
    return sum(u.outage_releases for u in c.units())


def test_s3_down_past_the_retry_bound_mid_unit_then_back_every_request_completes(fault_cluster, private_s3):
    c = fault_cluster(s3=private_s3, **outage_env())
    scaled_s3(c)
    c.start("w1")
    lines = slow_lines("so", 4)
    job_id = c.submit(lines)
    c.wait_unit_running("w1")
    down_at = time.time()
    private_s3.kill()
    shown = status_says(c, job_id, "waiting for", "storage")
    wait_for(lambda: released_units(c) >= 1, OUTAGE_RETRY_S + 90, "a unit released past the retry bound")
    time.sleep(max(0.0, down_at + S3_DOWN_S - time.time()))
    back_at = time.time()  # S3 answers at some point during start(): recovery counts from its restart
    private_s3.start()
    job = c.wait_final(job_id, timeout=240)
    _, errors = c.check(job, lines, "completed", expect_completed=4)
    assert errors == [] and "unreachable" in shown
    row = outage_row(c, "storage")
    assert row.outages >= 1 and row.released_units >= 1 and row.down_since is None, (row.outages, row.released_units)
    record_recovery(f"s3 down {S3_DOWN_S:.0f} s past a {OUTAGE_RETRY_S:.0f} s retry bound (s3 back -> job final)",
                    job.completed_at - back_at, released_units=released_units(c), generating_s=c.generating_s(back_at))


def test_the_database_down_past_the_commits_retries_then_back_every_request_completes(fault_cluster, private_postgres):
    c = fault_cluster(database=private_postgres.url, **outage_env())
    c.start("w1")
    lines = slow_lines("dq", 4)
    job_id = c.submit(lines)
    unit = c.wait_unit_running("w1")
    down_at = time.time()
    private_postgres.stop("immediate")
    shown = status_says(c, job_id, "waiting for the database")
    wait_for(lambda: "did not commit (database down)" in c.log_tail("w1", 10 ** 6), OUTAGE_RETRY_S + 120,
             "the worker to give the commit up and leave its release for the sweep")
    time.sleep(max(0.0, down_at + DB_DOWN_S - time.time()))
    back_at = time.time()
    private_postgres.start()
    job = c.wait_final(job_id, timeout=240)
    _, errors = c.check(job, lines, "completed", expect_completed=4)
    victim = {u.id: u for u in c.units()}[unit.id]
    assert errors == [] and "nothing fails" in shown
    assert victim.outage_releases >= 1 and victim.attempts - victim.outage_releases == 1, (victim.attempts, victim.outage_releases)
    record_recovery(f"database down {DB_DOWN_S:.0f} s past the commit's retries (database back -> job final)",
                    job.completed_at - back_at, generating_s=c.generating_s(back_at))


def test_redis_down_then_back_every_request_completes(fault_cluster, private_redis):
    redis = private_redis(persist=False)
    c = fault_cluster(broker=redis.url, **outage_env())
    c.start("w1")
    lines = slow_lines("rq", 4)
    job_id = c.submit(lines)
    c.wait_unit_running("w1")
    down_at = time.time()
    redis.kill()
    shown = status_says(c, job_id, "waiting for", "broker")
    time.sleep(max(0.0, down_at + REDIS_DOWN_S - time.time()))
    back_at = time.time()
    redis.start()
    job = c.wait_final(job_id, timeout=240)
    _, errors = c.check(job, lines, "completed", expect_completed=4)
    assert errors == [] and "unreachable" in shown
    wait_for(lambda: outage_row(c, "broker").down_since is None, 60, "the broker's outage to end on the board")
    record_recovery(f"redis down {REDIS_DOWN_S:.0f} s, no persistence (redis back -> job final)",
                    job.completed_at - back_at, generating_s=c.generating_s(back_at))


def test_s3_down_until_after_the_completion_window_expires_the_unfinished_and_keeps_the_finished(fault_cluster,
                                                                                                 private_s3):
    from batchinfer.jobs import service

    c = fault_cluster(s3=private_s3, **outage_env())
    scaled_s3(c)
    c.start("w1")
    lines = slow_lines("sx", 6)
    job_id = c.submit(lines, completion_window=f"{WINDOW_S}s")
    wait_for(lambda: any(u.status == "done" for u in c.units()), 180, "a first unit committed", every=0.02)
    private_s3.kill()
    status_says(c, job_id, "waiting for", "storage")
    expires_at = service.get(c.context(), job_id).expires_at
    wait_for(lambda: service.get(c.context(), job_id).status != "in_progress" or time.time() > expires_at + 5,
             WINDOW_S + 60, "the completion window to end")
    time.sleep(max(0.0, expires_at + 5 - time.time()))
    back_at = time.time()
    private_s3.start()
    job = c.wait_final(job_id, timeout=180)
    outputs, errors = c.check(job, lines, "expired")
    assert len(outputs) >= 2 and errors, (len(outputs), len(errors))  # the first unit's results are kept
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}, errors
    record_recovery(f"s3 down past a {WINDOW_S} s completion window (s3 back -> job final, expired)",
                    job.expired_at - back_at, kept=len(outputs), expired=len(errors))
