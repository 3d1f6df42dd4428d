"""validate_job: batched commits, a clean restart after a crash, cancel winning over validation, and the sweep
step for jobs left `validating`."""
import io

import pytest
from sqlalchemy import func, select

from batchinfer.db.models import Job, Request
from batchinfer.jobs import lifecycle, service
from batchinfer.jobs.intake import validate_job as job_validation
from batchinfer.jobs.faults import is_transient
from batchinfer.jobs.state import intake as state
from jobfiles import chat_line

pytestmark = pytest.mark.fast  # validated with the tiny tokenizer (make_settings), SQLite and local files


def _input(n: int) -> io.BytesIO:
    return io.BytesIO("".join(chat_line(f"r{i}", f"q{i}", max_tokens=1) + "\n" for i in range(n)).encode())


def _request_rows(ctx, job_id: str) -> int:
    with ctx.sessions() as session:
        return session.scalar(select(func.count()).select_from(Request).where(Request.job_id == job_id))


def test_a_crashed_validation_is_rerun_from_a_clean_start(make_context, monkeypatch):
    ctx = make_context()
    monkeypatch.setattr(job_validation, "INSERT_BATCH", 10)
    job = service.create_job(ctx, source=_input(35))
    real_commit, calls = state.add_requests, []

    def crash_on_third_batch(*args):
        calls.append(1)
        if len(calls) == 3:  # stands in for a SIGKILL mid-file: two batches are committed
            raise KeyboardInterrupt
        real_commit(*args)

    monkeypatch.setattr(state, "add_requests", crash_on_third_batch)
    try:
        job_validation.validate_job(ctx, job.id)
    except KeyboardInterrupt:
        pass
    assert _request_rows(ctx, job.id) == 20 and service.get(ctx, job.id).status == "validating"
    monkeypatch.setattr(state, "add_requests", real_commit)
    done = job_validation.validate_job(ctx, job.id)
    assert done.status == "queued" and done.total == 35 and _request_rows(ctx, job.id) == 35


def test_cancel_during_validation_wins(make_context, monkeypatch):
    ctx = make_context()
    monkeypatch.setattr(job_validation, "INSERT_BATCH", 10)
    job = service.create_job(ctx, source=_input(30))
    real_commit, calls = state.add_requests, []

    def cancel_after_first_batch(*args):
        calls.append(1)
        if len(calls) == 2:  # a cancel from another client lands between two batches
            assert service.cancel(ctx, job.id).status == "cancelled"
        real_commit(*args)

    monkeypatch.setattr(state, "add_requests", cancel_after_first_batch)
    final = job_validation.validate_job(ctx, job.id)
    assert final.status == "cancelled" and final.queued_at is None
    assert _request_rows(ctx, job.id) == 0 and service.get(ctx, job.id).failed == 0
    assert job_validation.validate_job(ctx, job.id).status == "cancelled"  # a rerun (the sweep's) changes nothing


def test_a_superseded_validation_run_stops_and_the_newer_one_decides(make_context, monkeypatch):
    ctx = make_context()
    monkeypatch.setattr(job_validation, "INSERT_BATCH", 10)
    job = service.create_job(ctx, source=_input(25))
    real_commit, calls = state.add_requests, []

    def second_run_takes_over(*args):
        calls.append(1)
        if len(calls) == 1:  # the sweep revalidates a run it thought lost, while the first one still goes on
            monkeypatch.setattr(state, "add_requests", real_commit)
            assert job_validation.validate_job(ctx, job.id).status == "queued"
        real_commit(*args)

    monkeypatch.setattr(state, "add_requests", second_run_takes_over)
    job_validation.validate_job(ctx, job.id)
    final = service.get(ctx, job.id)
    assert final.status == "queued" and final.total == 25 and _request_rows(ctx, job.id) == 25


def test_the_sweep_fails_a_job_whose_input_never_arrived(make_context):
    ctx = make_context(validation_stale_s=0.0)
    job = service.create_job(ctx, filename="lost.jsonl")  # a submit killed before its upload finished
    assert lifecycle.recover_validating(ctx, job.created_at + 1) == [job.id]
    failed = service.get(ctx, job.id)
    assert failed.status == "failed" and "never stored" in failed.errors[0]["message"]


def test_the_sweep_leaves_a_validation_that_makes_progress(make_context):
    ctx = make_context(validation_stale_s=60.0)
    job = service.create_job(ctx, source=_input(3))
    with ctx.sessions() as session:
        session.execute(Job.__table__.update().where(Job.id == job.id)
                        .values(created_at=job.created_at - 3600, validation_heartbeat_at=job.created_at))
        session.commit()
    assert lifecycle.recover_validating(ctx, job.created_at + 30) == []
    assert service.get(ctx, job.id).status == "validating"
    assert lifecycle.recover_validating(ctx, job.created_at + 61) == [job.id]
    assert service.get(ctx, job.id).status == "queued"


def test_the_sweep_hands_a_stale_validation_to_a_worker_once(make_context):
    ctx = make_context(validation_stale_s=60.0)
    job = service.create_job(ctx, source=_input(3))
    handed: list[str] = []
    later = job.created_at + 61
    assert lifecycle.recover_validating(ctx, later, handed.append) == [job.id]
    assert lifecycle.recover_validating(ctx, later + 30, handed.append) == []  # its lease was renewed
    assert handed == [job.id] and service.get(ctx, job.id).status == "validating"
    assert job_validation.validate_job(ctx, job.id).status == "queued"  # what the worker's validate_job task runs


def test_a_validation_that_cannot_succeed_fails_the_job_without_internals(make_context, tmp_path):
    broken = tmp_path / "broken-model"  # a model folder whose config cannot be read: no retry would help
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    ctx = make_context(model=str(broken))
    job = service.create_job(ctx, source=_input(2))
    assert job_validation.validate_job(ctx, job.id).status == "failed"
    message = service.get(ctx, job.id).errors[0]["message"]
    assert message.startswith("validation failed: ") and "JSONDecodeError" not in message, message
    assert str(tmp_path) not in message and "line 1 column" not in message, message  # no path, no parser text


def test_a_long_run_of_invalid_lines_still_renews_the_validation_lease(make_context, monkeypatch):
    ctx = make_context()
    monkeypatch.setattr(job_validation, "BEAT_S", 0.0)  # as if each line took the whole beat interval
    data = "{bad\n" * 20 + chat_line("ok", "q", max_tokens=1) + "\n"
    job = service.create_job(ctx, source=io.BytesIO(data.encode()), skip_invalid=True)
    real_commit, beats = state.add_requests, []

    def counted(*args):
        beats.append(1)
        real_commit(*args)

    monkeypatch.setattr(state, "add_requests", counted)
    assert job_validation.validate_job(ctx, job.id).status == "queued"
    assert len(beats) >= 20  # no valid row to commit through 20 lines, yet each renewed the lease


def test_a_fault_that_may_pass_keeps_the_job_validating_whoever_validates(make_context, monkeypatch):
    """One policy for the CLI's submit, the worker's task and the sweep: storage unreachable leaves the job
    `validating` (ValidationDeferred, a one-line error naming the job) and nothing fails it."""
    ctx = make_context()
    job = service.create_job(ctx, source=_input(3))

    def unreachable(key):  # stands in for S3 going away mid-run (the fault matrix causes it for real)
        raise ConnectionError("connection refused")

    monkeypatch.setattr(ctx.storage, "open_read", unreachable)
    with pytest.raises(job_validation.ValidationDeferred, match=f"job {job.id} is stored, but its validation stopped"):
        job_validation.validate_job(ctx, job.id)
    with pytest.raises(job_validation.ValidationDeferred):
        service.submit(ctx, _input(3))
    assert lifecycle.recover_validating(ctx, job.created_at + ctx.settings.validation_stale_s + 1) == []
    with ctx.sessions() as session:
        assert set(session.scalars(select(Job.status))) == {"validating"}


@pytest.mark.parametrize("exc, transient", [
    (ConnectionError("refused"), True), (TimeoutError(), True), (FileNotFoundError("gone"), False),
    (ValueError("bad"), False), (PermissionError("denied"), False)])
def test_one_rule_says_which_faults_pass(exc, transient):
    assert is_transient(exc) == transient
