"""Infrastructure faults: Redis restarted with and without what it held, the database restarted, S3 down
during a unit and during submit, and a submit while Redis is down. Each case runs against private servers
(never the shared ones) and measures its recovery time: from the fault to the job's final state."""
from __future__ import annotations

import time

import pytest

from faultlib import record_recovery, slow_lines, wait_for


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
