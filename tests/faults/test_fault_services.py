"""Infrastructure faults: Redis restarted with and without what it held, the database restarted, S3 down
during a unit and during submit, and a submit while Redis is down. Each case runs against private servers
(never the shared ones) and measures its recovery time: from the fault to the job's final state."""
from __future__ import annotations

import time

import pytest

from faultlib import job_lines, record_recovery, slow_lines, wait_for


@pytest.mark.parametrize("persist", [True, False], ids=["appendonly", "no-persistence"])
def test_redis_restarted_mid_job_the_job_completes(fault_cluster, private_redis, persist):
    """With AOF every message and registry key comes back; without it they are all gone, and the sweep
    sends again the units the database has as queued with no message left for them."""
    redis = private_redis(persist=persist)
    c = fault_cluster(broker=redis.url)
    c.start("w1")
    lines = slow_lines("p" if persist else "n", 6)
    job_id = c.submit(lines)
    c.wait_unit_running("w1")
    fault_at = time.time()
    redis.restart(down_s=1.0)
    job = c.wait_final(job_id, timeout=120)
    c.check(job, lines, "completed", expect_completed=6)
    if not persist:  # the queued units' messages were lost with Redis: the sweep sent them again
        assert "no message for it in the broker" in c.log_tail("w1", 10 ** 6)
    record_recovery(f"redis restarted mid-job, {'appendonly' if persist else 'no persistence'}",
                    job.completed_at - fault_at)


def test_the_database_down_across_a_units_commit_the_job_completes(fault_cluster, private_postgres):
    """A second PostgreSQL cluster, stopped as a crash would (immediate) while a unit generates, and started
    again only once the unit has stored its results: its commit retries its transaction until the database
    is back (pool_pre_ping drops the dead connections), and the sweep's failed ticks are retried too."""
    from batchinfer.jobs import keys

    c = fault_cluster(database=private_postgres.url)
    c.start("w1")
    lines = slow_lines("db", 6)
    job_id = c.submit(lines)
    unit = c.wait_unit_running("w1")
    fault_at = time.time()
    private_postgres.stop("immediate")
    wait_for(lambda: c.context().storage.exists(keys.unit_results(unit.id, 1)), 90, "the unit's results file")
    time.sleep(1.0)  # the commit is failing now
    private_postgres.start()
    back_at = time.time()
    job = c.wait_final(job_id, timeout=120)
    c.check(job, lines, "completed", expect_completed=6)
    assert "database: " in c.log_tail("w1", 10 ** 6), "the commit never had to retry"
    record_recovery("database down across a unit's commit", job.completed_at - fault_at,
                    database_down_s=round(back_at - fault_at, 2))


def test_submit_while_redis_is_down_fails_clearly_and_the_job_runs_once_redis_is_back(fault_cluster, private_redis, tmp_path):
    """`batchinfer submit` stores and queues the job, then cannot send the dispatch: it exits 1 with one line
    naming the job, and once Redis is back the sweep dispatches it (no other submit needed)."""
    from batchinfer.jobs import service

    redis = private_redis()
    c = fault_cluster(broker=redis.url)
    c.start("w1")
    lines = job_lines("rd", 4)
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(lines) + "\n")
    redis.kill()
    done = c.cli("submit", str(path))
    print("submit:", done.returncode, done.stdout, done.stderr)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    fault_at = time.time()
    redis.start()
    jobs = service.list_jobs(c.context())
    assert len(jobs) == 1 and jobs[0].id in done.stderr and "broker is unreachable" in done.stderr, done.stderr
    job = c.wait_final(jobs[0].id, timeout=90)  # nothing else is submitted: the sweep dispatches it
    c.check(job, lines, "completed", expect_completed=4, stderr=[done.stderr])
    record_recovery("submit while redis is down (redis back -> job final)", job.completed_at - fault_at)
