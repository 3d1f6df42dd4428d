"""Faults that hit a streamed batch mid-flight (BATCHINFER_STREAM_DISPATCH=1): a worker SIGKILLed, and the
only worker killed and restarted, while units of the batch run and the rest of its file is still validated by
`batchinfer submit`. The null engine answers at once, so the file's parts (1,000 lines each) and units are
what is timed; the submit is held (SIGSTOP) at the fault, so it lands mid-validation for sure."""
from __future__ import annotations

import time

from faultlib import job_lines, pause, record_recovery, resume, write_lines

LINES = 6_000  # six parts: units of the first parts run while later ones are validated
STREAM = {"BATCHINFER_STREAM_DISPATCH": "1", "BATCHINFER_ENGINE": "null", "BATCHINFER_MAX_REQUESTS_PER_UNIT": "64"}


def _streamed_unit_running(c, tmp_path, worker: str | None = None):
    """Submits the file and holds the submit as soon as a unit of it runs while it validates: (submit, job, unit)."""
    lines = job_lines("s", LINES, max_tokens=1)
    submit = c.start_cli("submit", "submit", str(write_lines(tmp_path / "stream.jsonl", lines)))
    job_id = c.wait_validation_underway()
    unit = c.wait_unit_running(worker)
    pause(submit)
    assert c.job(job_id).status == "validating", "the validation ended before the fault: nothing streamed"
    return submit, job_id, unit, lines


def test_a_worker_sigkilled_while_its_streamed_batch_validates_loses_and_repeats_nothing(fault_cluster, tmp_path):
    c = fault_cluster(**STREAM)
    c.start("w1", "w2")
    submit, job_id, victim, lines = _streamed_unit_running(c, tmp_path)
    killed_at = c.kill(victim.worker)
    resume(submit)
    assert submit.wait(300) == 0, c.output("submit")
    job = c.wait_final(job_id, timeout=300)
    c.check(job, lines, "completed", expect_completed=LINES)
    record_recovery("worker sigkilled mid-unit while its streamed batch validates (6,000 lines, time to completion)",
                    job.completed_at - killed_at)


def test_the_only_worker_killed_and_restarted_while_a_streamed_batch_validates_completes_it(fault_cluster, tmp_path):
    """The killed worker's prefetched and running unit messages are lost with it: the sweep's orphan requeue and
    the queue move's dispatch must bring every request back, once."""
    c = fault_cluster(**STREAM)
    c.start("w1")
    submit, job_id, _, lines = _streamed_unit_running(c, tmp_path, "w1")
    killed_at = c.kill("w1")
    resume(submit)
    assert submit.wait(300) == 0, c.output("submit")
    c.start("w1")
    back_at = time.time()
    job = c.wait_final(job_id, timeout=300)
    c.check(job, lines, "completed", expect_completed=LINES)
    record_recovery("only worker killed while its streamed batch validates, restarted (time to completion)",
                    job.completed_at - back_at, including_restart_s=round(job.completed_at - killed_at, 2))
