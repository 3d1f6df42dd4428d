from sqlalchemy import select

from batchinfer.jobs import service
from batchinfer.jobs.state import units

from batchinfer.jobs.units import runner as unit_runner
from batchinfer.db.models import Request, WorkUnit
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.units.runner import run_unit
from jobfiles import completion_line
from jobfiles import read_output, submit_lines


def _one_unit_job(ctx, n=2):
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(n)])
    (unit,) = dispatch(ctx)
    return job, unit


def test_a_unit_run_twice_counts_each_request_once(make_context, generator):
    ctx = make_context()
    job, unit = _one_unit_job(ctx)
    first = run_unit(ctx, unit.unit_id, generator, "w1")
    second = run_unit(ctx, unit.unit_id, generator, "w2")
    assert first.committed and first.completed == 2 and first.finalized_jobs == (job.id,)
    assert not second.committed
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == ("completed", 2, 0)
    assert [o["metrics"]["worker"] for o in read_output(ctx, job.id)] == ["w1", "w1"]


def test_a_unit_redelivered_after_a_crash_runs_again_and_commits_once(make_context, generator):
    ctx = make_context()
    job, unit = _one_unit_job(ctx)
    assert units.start_unit(ctx, unit.unit_id, "crashed-worker") is not None  # a run that died mid-unit
    outcome = run_unit(ctx, unit.unit_id, generator, "w2")
    assert outcome.committed and outcome.completed == 2
    with ctx.sessions() as session:
        row = session.get(WorkUnit, unit.unit_id)
    assert (row.attempts, row.worker, row.result_key) == (2, "w2", f"units/{unit.unit_id}/results-2.jsonl")
    assert service.get(ctx, job.id).completed == 2


def test_racing_runs_of_one_unit_on_postgres_commit_once(make_context, postgres_url, generator):
    ctx = make_context(database_url=postgres_url)
    job, unit = _one_unit_job(ctx)
    to_run_a = units.start_unit(ctx, unit.unit_id, "wa").to_run
    to_run_b = units.start_unit(ctx, unit.unit_id, "wb").to_run
    assert to_run_a == to_run_b and len(to_run_a) == 2  # both runs hold the same requests
    records = unit_runner._generate(unit_runner._load_requests(ctx, unit.unit_id, to_run_a), generator, "wa", None)
    a = unit_runner._commit(ctx, unit.unit_id, "units/a.jsonl", records)
    b = unit_runner._commit(ctx, unit.unit_id, "units/b.jsonl", records)
    assert a.committed and not b.committed
    job = service.get(ctx, job.id)
    assert job.completed == 2 and job.completion_tokens == sum(r.completion_tokens for r in records.values())
    with ctx.sessions() as session:
        assert session.get(WorkUnit, unit.unit_id).result_key == "units/a.jsonl"


def test_an_engine_failure_fails_the_units_requests_with_server_error(make_context):
    class BrokenEngine:  # a fault the real engine cannot be made to raise on demand
        def generate(self, requests, on_result=None, aborts=None):
            raise RuntimeError("CUDA out of memory")

    ctx = make_context()
    job, unit = _one_unit_job(ctx)
    outcome = run_unit(ctx, unit.unit_id, BrokenEngine(), "w1")
    assert outcome.committed and outcome.failed == 2
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == ("completed", 0, 2)
    errors = read_output(ctx, job.id, errors=True)
    assert [e["error"]["code"] for e in errors] == ["server_error", "server_error"]
    assert "CUDA out of memory" in errors[0]["error"]["message"]


def test_requests_of_a_cancelled_job_are_not_run(make_context, generator):
    ctx = make_context()
    job, unit = _one_unit_job(ctx)
    service.cancel(ctx, job.id)
    outcome = run_unit(ctx, unit.unit_id, generator, "w1")
    assert outcome.committed and outcome.completed == 0
    with ctx.sessions() as session:
        assert set(session.scalars(select(Request.status))) == {"cancelled"}


def test_a_unit_this_process_dispatched_reads_its_input_from_memory_and_a_rerun_from_storage(make_context, generator):
    """Dispatch keeps each unit input it stored (record_store.kept_inputs): the unit runs with its file gone, to the
    same answers as one read from storage; a second run of the unit (a rerun) finds nothing kept and reads storage."""
    from batchinfer.jobs import record_store
    from batchinfer.jobs.record_store import kept_inputs

    ctx = make_context()
    kept_job, kept_unit = _one_unit_job(ctx, n=3)
    read_job, read_unit = _one_unit_job(ctx, n=3)
    assert kept_inputs(ctx.storage).take(read_unit.unit_id) is not None  # dropped: this one reads its file
    ctx.storage.delete(record_store.unit_input(kept_unit.unit_id))
    assert run_unit(ctx, kept_unit.unit_id, generator, "w1").completed == 3
    assert run_unit(ctx, read_unit.unit_id, generator, "w1").completed == 3

    def answers(job_id):
        return [(o["custom_id"], o["response"]["body"]["choices"], o["response"]["body"]["usage"])
                for o in read_output(ctx, job_id)]
    assert answers(kept_job.id) == answers(read_job.id) and len(answers(kept_job.id)) == 3

    _, rerun_unit = _one_unit_job(ctx, n=2)
    assert units.start_unit(ctx, rerun_unit.unit_id, "crashed-worker") is not None
    assert kept_inputs(ctx.storage).take(rerun_unit.unit_id) is not None  # the crashed run took it
    assert run_unit(ctx, rerun_unit.unit_id, generator, "w2").completed == 2  # from storage
    other = make_context(data_dir=ctx.settings.data_dir / "elsewhere")
    assert kept_inputs(other.storage) is not kept_inputs(ctx.storage)


def test_kept_unit_inputs_stay_under_their_token_bound_and_age():
    from batchinfer.engine.types import SamplingParams
    from batchinfer.jobs.records import PreparedRequest, UnitRequest
    from batchinfer.jobs.record_store import UnitInputs

    def unit(tokens):
        return [UnitRequest("j", PreparedRequest(0, "/v1/completions", "m", list(range(tokens)), SamplingParams()))]

    kept = UnitInputs(max_tokens=100, max_age_s=3600)
    assert kept.put("a", unit(60)) and not kept.put("b", unit(50))  # past the bound: b's unit reads storage
    assert kept.take("b") is None and kept.take("a")[0].request.prompt_token_ids == list(range(60))
    assert kept.take("a") is None  # taken once
    assert kept.put("b", unit(50))
    stale = UnitInputs(max_tokens=100, max_age_s=0.0)
    assert stale.put("a", unit(60)) and stale.put("b", unit(60))  # a, never run here, was dropped on b's put
    assert stale.take("a") is None and stale.take("b") is not None


def test_a_unit_reports_the_adapters_its_lines_named(make_context):
    """The worker publishes them (routing prefers a worker holding an adapter loaded)."""
    from batchinfer.runtime.null_generator import NullGenerator

    ctx = make_context(adapters={"tuned-a": "/x", "tuned-b": "/y"})
    models = ["tuned-b", "smollm2-135m-instruct", "tuned-a", "tuned-b"]
    submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:", model=m) for i, m in enumerate(models)])
    (unit,) = dispatch(ctx)
    outcome = run_unit(ctx, unit.unit_id, NullGenerator.from_settings(ctx.settings), "w1")
    assert outcome.completed == 4 and outcome.adapters == ("tuned-b", "tuned-a")
