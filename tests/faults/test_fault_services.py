"""Infrastructure faults: Redis restarted with and without what it held, the database restarted, S3 down
during a unit and during submit, and a submit while Redis is down. Each case runs against private servers
(never the shared ones) and measures its recovery time: from the fault to the job's final state."""
from __future__ import annotations

import os
import sys
import time

import pytest

from faultlib import job_lines, pause, record_recovery, resume, slow_lines, wait_for, write_lines


@pytest.mark.parametrize("persist", [True, False], ids=["appendonly", "no-persistence"])
def test_redis_restarted_mid_job_the_job_completes(fault_cluster, private_redis, persist):
    """With AOF every message and registry key comes back; without it they are all gone, and the sweep
    sends again the units the database has as queued with no message left for them."""
    redis = private_redis(persist=persist)
    c = fault_cluster(broker=redis.url)
    c.start("w1")
    lines = slow_lines("p" if persist else "n", 4)
    job_id = c.submit(lines)
    c.wait_unit_running("w1")
    fault_at = time.time()
    redis.restart(down_s=1.0)
    job = c.wait_final(job_id, timeout=120)
    c.check(job, lines, "completed", expect_completed=4)
    c.assert_not_logged("optional breaking change")  # Celery's reconnect notice: the choice is pinned
    if not persist:  # the queued units' messages were lost with Redis: the sweep sent them again
        assert "no message for it in the broker" in c.log_tail("w1", 10 ** 6)
    record_recovery(f"redis restarted mid-job, {'appendonly' if persist else 'no persistence'}",
                    job.completed_at - fault_at, generating_s=c.generating_s(fault_at))


def test_the_database_down_across_a_units_commit_the_job_completes(fault_cluster, private_postgres):
    """A second PostgreSQL cluster, stopped as a crash would (immediate) while a unit generates, and started
    again once the unit has stored its results, within the commit's retries: the commit gets through
    (pool_pre_ping drops the dead connections). Down past them: test_fault_outages (the unit is released,
    and the sweep runs it again once the database answers)."""
    from batchinfer.jobs import record_store

    c = fault_cluster(database=private_postgres.url)
    c.start("w1")
    lines = slow_lines("db", 4)
    job_id = c.submit(lines)
    unit = c.wait_unit_running("w1")
    fault_at = time.time()
    private_postgres.stop("immediate")
    wait_for(lambda: c.context().storage.exists(record_store.unit_results(unit.id, 1)), 90, "the unit's results file")
    time.sleep(1.0)  # the commit is failing now
    private_postgres.start()
    back_at = time.time()
    job = c.wait_final(job_id, timeout=120)
    c.check(job, lines, "completed", expect_completed=4)
    assert "database: " in c.log_tail("w1", 10 ** 6), "the commit never had to retry"
    assert {u.id: u for u in c.units()}[unit.id].attempts == 1
    record_recovery("database down across a unit's commit, within its retries", job.completed_at - fault_at,
                    database_down_s=round(back_at - fault_at, 2), generating_s=c.generating_s(fault_at))


def test_submit_while_redis_is_down_fails_clearly_and_the_job_runs_once_redis_is_back(fault_cluster, private_redis, tmp_path):
    """Direct: `batchinfer submit` stores and queues the job, then cannot send the dispatch: it exits 1 with
    one line naming the job. Through the API: the batch is created and waits in `validating`. Once Redis is
    back the sweep validates and dispatches both (no other submit needed; not after validation_stale_s)."""
    import subprocess

    from batchinfer.jobs import service

    redis = private_redis()
    c = fault_cluster(broker=redis.url)
    c.start("w1")
    api_env = c.serve()
    lines, api_lines = job_lines("rd", 4), job_lines("ra", 4)
    path, api_path = write_lines(tmp_path / "input.jsonl", lines), write_lines(tmp_path / "api.jsonl", api_lines)
    redis.kill()
    api_run = [sys.executable, "-m", "batchinfer.cli", "submit", str(api_path)]
    through_api = subprocess.Popen(api_run, env={**os.environ, **c.s3_env, **c.env, **api_env}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    done = c.cli("submit", str(path))
    print("submit:", done.returncode, done.stdout, done.stderr)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    # a client that will not wait long: it gives up with one line that names the batch, which goes on
    gave_up = subprocess.run(api_run, env={**os.environ, **c.s3_env, **c.env, **api_env,
                                           "BATCHINFER_API_SUBMIT_WAIT_S": "2"}, capture_output=True, text=True, timeout=120)
    assert gave_up.returncode == 1 and gave_up.stdout == "", (gave_up.stdout, gave_up.stderr)
    assert len(gave_up.stderr.strip().splitlines()) == 1 and "still validating after 2 s" in gave_up.stderr, gave_up.stderr
    impatient_id = gave_up.stderr.split()[2]
    wait_for(lambda: len(service.list_jobs(c.context())) == 3, 60, "the batches through the API")
    fault_at = time.time()
    redis.start()
    api_out, api_err = through_api.communicate(timeout=120)
    assert through_api.returncode == 0 and api_out.startswith("batch_"), (api_out, api_err)
    direct = [j for j in service.list_jobs(c.context()) if j.id not in (api_out.strip(), impatient_id)]
    assert len(direct) == 1 and direct[0].id in done.stderr and "broker is unreachable" in done.stderr, done.stderr
    cases = ((direct[0].id, lines, "direct"), (api_out.strip(), api_lines, "API"),
             (impatient_id, api_lines, "API, the client gave up waiting"))
    for job_id, job_input, how in cases:
        job = c.wait_final(job_id, timeout=90)  # nothing else is submitted: the sweep validates and dispatches
        c.check(job, job_input, "completed", expect_completed=4, stderr=[done.stderr, api_err, gave_up.stderr])
        record_recovery(f"submit while redis is down, {how} (redis back -> job final)", job.completed_at - fault_at,
                        generating_s=c.generating_s(fault_at))


def test_s3_down_while_a_unit_generates_then_back_the_job_completes(fault_cluster, private_s3):
    """SeaweedFS killed while a unit generates and started again a few seconds later: the unit's results
    write (boto3's retries) or its rerun gets through, and every request completes once."""
    c = fault_cluster(s3=private_s3)
    c.start("w1")
    lines = slow_lines("s3", 4)
    job_id = c.submit(lines)
    c.wait_unit_running("w1")
    fault_at = time.time()
    private_s3.kill()
    time.sleep(3.0)
    private_s3.start()
    back_at = time.time()
    job = c.wait_final(job_id, timeout=150)
    c.check(job, lines, "completed", expect_completed=4)
    record_recovery("s3 down while a unit generates, then back", job.completed_at - fault_at,
                    s3_down_s=round(back_at - fault_at, 2), generating_s=c.generating_s(fault_at))


def test_submit_while_s3_is_down_fails_clearly_and_leaves_no_open_job(fault_cluster, private_s3, tmp_path):
    """`batchinfer submit` cannot store the input: it exits 1 with one line naming the cause, and the job
    row it had made is already failed with that cause (nothing waits for a sweep, nothing runs)."""
    from batchinfer.jobs import service

    c = fault_cluster(s3=private_s3)
    c.s3_env = {**c.s3_env, "AWS_MAX_ATTEMPTS": "3"}
    lines = job_lines("sub", 3)
    path = write_lines(tmp_path / "input.jsonl", lines)
    c.context()  # the schema
    private_s3.kill()
    started = time.time()
    done = c.cli("submit", str(path))
    gave_up_s = time.time() - started
    print("submit:", done.returncode, done.stdout, done.stderr)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    assert "could not store the input file" in done.stderr and "Traceback" not in done.stderr
    jobs = service.list_jobs(c.context())
    assert [j.status for j in jobs] in ([], ["failed"]), [(j.id, j.status) for j in jobs]
    for job in jobs:
        assert job.id in done.stderr and "could not store the input file" in job.errors[0]["message"], job.errors
        assert (job.total, job.completed, job.failed) == (0, 0, 0)
    record_recovery("submit while s3 is down (time to the error, 3 boto3 attempts)", gave_up_s)


def test_s3_down_mid_validation_of_a_direct_submit_names_the_job_and_the_sweep_resumes_it(fault_cluster, private_s3,
                                                                                          tmp_path):
    """SeaweedFS killed while `batchinfer submit` validates a stored file: the submit exits 1 with one line
    naming the job and the cause; once S3 is back a worker's sweep validates the job again from the start."""
    from batchinfer.jobs import service

    c = fault_cluster(s3=private_s3, BATCHINFER_VALIDATION_STALE_S="3")
    c.s3_env = {**c.s3_env, "AWS_MAX_ATTEMPTS": "2"}
    lines = job_lines("sv", 20_000, max_tokens=1)
    submit = c.start_cli("submit", "submit", str(write_lines(tmp_path / "big.jsonl", lines)))
    job_id = c.wait_validation_underway()
    pause(submit)  # mid-file for sure while S3 goes away
    private_s3.kill()
    resume(submit)
    assert submit.wait(180) == 1, c.output("submit")
    stderr = c.output("submit").strip()
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: job ") and job_id in stderr, stderr
    assert "its validation stopped" in stderr and "Traceback" not in stderr, stderr
    assert c.job(job_id).status == "validating"  # kept for the sweep, not failed on a fault that passes
    private_s3.start()
    back_at = time.time()
    c.start("w1")
    resumed = wait_for(lambda: (job := c.job(job_id)).status != "validating" and job, 180,
                       f"job {job_id} to leave validating")
    recovered_at = time.time()
    assert resumed.status in ("queued", "in_progress") and resumed.total == len(lines), (resumed.status, resumed.total)
    service.cancel(c.context(), job_id)  # 20,000 requests take minutes on a CPU; a cancel still accounts for each
    job = c.wait_final(job_id, timeout=240)
    c.check(job, lines, "cancelled", stderr=[])
    record_recovery("s3 down mid-validation of a direct submit (s3 back -> validated again)", recovered_at - back_at,
                    validation_stale_s=3)
