"""Submit-side faults through real `batchinfer submit` processes (PostgreSQL, SeaweedFS S3, Redis, real
workers): a submit SIGKILLed or interrupted mid-validation, a cancel while the submit still validates, and
twenty concurrent submits on two workers, ten of them of the same file."""
from __future__ import annotations

import os
import re
import signal
import time

from batchinfer.jobs import lifecycle, service
from batchinfer.jobs.dispatch.planning import dispatch
from faultlib import job_lines, pause, record_recovery, resume, wait_for, write_lines

BIG = 20_000  # lines: tiny requests, so validation is all per-line work and lasts long enough to be hit
LARGEST = 50_000  # lines, the most a file may have: the longest validation there is
JOB_ID = re.compile(r"^(batch_[0-9a-f]{32})$", re.M)


def _kill(proc) -> float:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(20)
    return time.time()


def test_a_submit_sigkilled_mid_validation_is_validated_again_by_a_worker(fault_cluster, tmp_path):
    c = fault_cluster(BATCHINFER_VALIDATION_STALE_S="3", BATCHINFER_MAX_REQUESTS_PER_UNIT="64")
    c.start("w1")
    lines = job_lines("v", BIG, max_tokens=1)
    submit = c.start_cli("submit", "submit", str(write_lines(tmp_path / "big.jsonl", lines)))
    job_id = c.wait_validation_underway()
    pause(submit)
    assert c.job(job_id).status == "validating", "the submit ended its validation before the kill"
    killed_at = _kill(submit)
    resumed = wait_for(lambda: (job := c.job(job_id)).status != "validating" and job, 120,
                       f"job {job_id} to leave validating")
    recovered_at = time.time()
    assert resumed.status in ("queued", "in_progress") and resumed.total == BIG, (resumed.status, resumed.total)
    assert c.request_rows(job_id) == BIG  # the rerun started clean: no row of the killed run counts twice
    assert "validating it again" in c.output("w1")
    # 20,000 requests take minutes on a CPU: the rest is cancelled, which still accounts for every line
    service.cancel(c.context(), job_id)
    job = c.wait_final(job_id, timeout=240)
    _, errors = c.check(job, lines, "cancelled")
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    record_recovery("submit sigkilled mid-validation (20,000 lines): validated again", recovered_at - killed_at,
                    validation_stale_s=3)


def test_cancel_during_validation_wins_and_nothing_of_the_job_runs(fault_cluster, tmp_path):
    c = fault_cluster(BATCHINFER_MAX_REQUESTS_PER_UNIT="64")
    c.start("w1")
    lines = job_lines("x", LARGEST, max_tokens=1)
    submit = c.start_cli("submit", "submit", str(write_lines(tmp_path / "largest.jsonl", lines)))
    job_id = c.wait_validation_underway()
    pause(submit)  # mid-file for sure: the cancel lands between two of its batched commits
    cancelled_at = time.time()
    # the cancel comes from this process (the CLI's own start-up, a few seconds, is no part of the case)
    answer = service.cancel(c.context(), job_id)
    assert answer.status == "cancelled" and answer.queued_at is None, "the validation ended before the cancel"
    resume(submit)
    assert submit.wait(120) == 0, c.output("submit")
    stopped_at = time.time()
    assert f"job {job_id} was cancelled while it validated" in c.output("submit")
    # a sweep and a dispatch of our own, each of which would revive or plan a job that was set back to queued
    ctx = c.context()
    lifecycle.sweep_jobs(ctx, now=time.time() + ctx.settings.validation_stale_s + 1)
    assert dispatch(ctx) == []
    job = c.job(job_id)
    assert job.status == "cancelled" and job.queued_at is None, (job.status, job.queued_at)
    assert c.units() == [] and c.request_rows(job_id) == 0
    outputs, errors = c.files(job_id)
    assert outputs == [] and errors == [] and (job.completed, job.failed, job.total) == (0, 0, 0)
    c.assert_no_traceback()
    record_recovery("cancel during validation (50,000 lines): cancel to submit exit", stopped_at - cancelled_at)


def test_a_submit_interrupted_mid_validation_cancels_its_job_at_once(fault_cluster, tmp_path):
    c = fault_cluster()
    c.context()  # no worker: the job must end by the submit's own hand, not wait for a sweep
    submit = c.start_cli("submit", "submit", str(write_lines(tmp_path / "big.jsonl", job_lines("i", LARGEST, max_tokens=1))))
    job_id = c.wait_validation_underway()
    pause(submit)
    interrupted_at = time.time()
    os.killpg(submit.pid, signal.SIGINT)  # Ctrl-C, taken as soon as the submit runs again
    resume(submit)
    assert submit.wait(60) == 130, c.output("submit")
    ended_at = time.time()
    assert f"interrupted: job {job_id} cancelled before its validation ended" in c.output("submit")
    job = c.job(job_id)
    assert job.status == "cancelled" and job.queued_at is None and c.request_rows(job_id) == 0, job.status
    c.assert_no_traceback()
    record_recovery("submit interrupted (Ctrl-C) mid-validation: job cancelled", ended_at - interrupted_at)


def test_twenty_concurrent_submits_on_two_workers_all_complete_without_deadlock(fault_cluster, tmp_path):
    c = fault_cluster(BATCHINFER_MAX_REQUESTS_PER_UNIT="4")
    c.start("w1", "w2")
    same = job_lines("same", 3, max_tokens=1)
    same_path = write_lines(tmp_path / "same.jsonl", same)
    own = [job_lines(f"own{i}", 3, max_tokens=1) for i in range(10)]
    files = [(same_path, same)] * 10 + [(write_lines(tmp_path / f"own{i}.jsonl", lines), lines) for i, lines in enumerate(own)]
    started = time.time()
    submits = [c.start_cli(f"submit{i}", "submit", str(path)) for i, (path, _) in enumerate(files)]
    for i, proc in enumerate(submits):
        assert proc.wait(300) == 0, c.output(f"submit{i}")
    ids = [JOB_ID.findall(c.output(f"submit{i}"))[-1] for i in range(len(submits))]
    assert len(set(ids)) == 20  # ten submits of one file are ten jobs
    jobs = [c.wait_final(job_id) for job_id in ids]
    for job, (_, lines) in zip(jobs, files):
        c.check(job, lines, "completed", expect_completed=len(lines))  # each custom_id exactly once per job
    c.assert_not_logged("deadlock", "lock timeout", "LockNotAvailable", "could not obtain lock")
    record_recovery("10 concurrent submits of one file (time to completion)",
                    max(j.completed_at for j in jobs[:10]) - started)
    record_recovery("20 concurrent submits, 2 workers (time to completion)", max(j.completed_at for j in jobs) - started)


def test_a_submit_sigkilled_during_its_upload_leaves_a_job_the_sweep_fails_naming_the_cause(fault_cluster, tmp_path):
    """Killed after the job row is made and before the input is stored: no input will ever come, so the sweep
    fails the job with that cause instead of leaving it `validating` (or validating a file that is not there)."""
    c = fault_cluster(BATCHINFER_VALIDATION_STALE_S="3")
    ctx = c.context()
    filler = "u" * 2400  # ~120 MB in all: the upload lasts long enough to be caught mid-way
    path = write_lines(tmp_path / "large.jsonl", job_lines("up", LARGEST, max_tokens=1, user=filler))
    submit = c.start_cli("submit", "submit", str(path))
    job_id = wait_for(lambda: next((j.id for j in service.list_jobs(ctx)), None), 120, "the job row", every=0.01)
    pause(submit)
    assert not ctx.storage.exists(service.get(ctx, job_id).input_key), "the upload ended before the kill"
    killed_at = _kill(submit)
    c.start("w1")
    job = c.wait_final(job_id, timeout=120)
    assert job.status == "failed" and (job.total, job.completed, job.failed) == (0, 0, 0), job.status
    assert "the input file was never stored" in job.errors[0]["message"], job.errors
    c.assert_no_traceback()
    record_recovery("submit sigkilled during its upload: job failed by the sweep", job.failed_at - killed_at,
                    validation_stale_s=3)
