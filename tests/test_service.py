import time

import pytest
from sqlalchemy import func, select

from batchinfer.jobs import lifecycle, service
from batchinfer.db.models import Request
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.errors import InvalidRequest, JobConflict, JobNotFound, TooManyActive
from batchinfer.jobs.units.runner import run_unit
from jobfiles import chat_line, completion_line
from jobfiles import read_output, submit_lines


def _run_units(ctx, generator, units):
    for unit in units:
        run_unit(ctx, unit.unit_id, generator, "test-worker")


@pytest.mark.fast
def test_submit_validates_and_queues(make_context):
    ctx = make_context()
    job = submit_lines(ctx, [chat_line("a", "hi"), completion_line("b", "hey")], metadata={"team": "x"})
    assert job.status == "queued" and job.total == 2 and job.failed == 0 and job.metadata_ == {"team": "x"}
    assert job.queued_at >= job.created_at and job.expires_at == pytest.approx(job.created_at + 86400)
    assert ctx.storage.exists(f"jobs/{job.id}/input.jsonl")
    assert ctx.storage.exists(f"jobs/{job.id}/prepared-parts/000000.jsonl")


@pytest.mark.fast
def test_an_invalid_file_fails_with_every_error_and_nothing_runs(make_context):
    ctx = make_context()
    job = submit_lines(ctx, [chat_line("a", "hi"), "{oops", chat_line("a", "again")])
    assert job.status == "failed" and job.failed_at is not None
    assert [(e["line"], e["code"]) for e in job.errors] == [(2, "invalid_json_line"), (3, "duplicate_custom_id")]
    with ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Request)) == 0
    assert dispatch(ctx) == []
    assert [e["error"]["code"] for e in read_output(ctx, job.id, errors=True)] == ["invalid_json_line",
                                                                                  "duplicate_custom_id"]


@pytest.mark.fast
def test_an_unknown_model_is_refused(make_context):
    with pytest.raises(InvalidRequest, match="The provided model 'gpt-4o' is not supported") as refused:
        submit_lines(make_context(), [chat_line("a", "hi")], model="gpt-4o")
    assert (refused.value.code, refused.value.param) == ("model_not_found", "model")


def test_skip_invalid_runs_the_valid_lines_and_lists_the_rest(make_context, generator):
    ctx = make_context()
    job = submit_lines(ctx, ["[]", completion_line("ok", "The sky is"), completion_line("bad", "x", max_tokens=-1)],
                       skip_invalid=True)
    assert job.status == "queued" and job.total == 3 and job.failed == 2
    _run_units(ctx, generator, dispatch(ctx))
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == ("completed", 1, 2)
    assert [o["custom_id"] for o in read_output(ctx, job.id)] == ["ok"]
    errors = read_output(ctx, job.id, errors=True)
    assert [(e["error"]["line"], e["error"]["code"]) for e in errors] == [(1, "invalid_request"),
                                                                          (3, "integer_below_min_value")]
    assert [e["response"] and e["response"]["status_code"] for e in errors] == [None, 400]  # the body's own 400


def test_cancel_keeps_finished_results(make_context, generator):
    ctx = make_context(max_requests_per_unit=1)
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Number {i} is") for i in range(3)])
    units = dispatch(ctx)
    assert len(units) == 3
    _run_units(ctx, generator, units[:1])
    job = service.cancel(ctx, job.id)
    assert job.status == "cancelled" and job.cancelling_at <= job.cancelled_at
    assert (job.completed, job.failed) == (1, 2)
    assert [o["custom_id"] for o in read_output(ctx, job.id)] == ["c0"]
    assert [(e["custom_id"], e["error"]["code"]) for e in read_output(ctx, job.id, errors=True)] == [
        ("c1", "batch_cancelled"), ("c2", "batch_cancelled")]
    _run_units(ctx, generator, units[1:])  # units already queued find nothing left to run
    assert service.get(ctx, job.id).completed == 1
    again = service.cancel(ctx, job.id)  # OpenAI's rule: cancelling a cancelled batch answers with it as it is
    assert (again.status, again.cancelled_at, again.completed, again.failed) == ("cancelled", job.cancelled_at, 1, 2)
    done = submit_lines(ctx, [completion_line("d", "Hi")])
    _run_units(ctx, generator, dispatch(ctx))
    with pytest.raises(JobConflict, match="Cannot cancel a batch with status 'completed'"):
        service.cancel(ctx, done.id)


def test_expiry_keeps_finished_results_and_expires_the_rest(make_context, generator):
    ctx = make_context(max_requests_per_unit=1)
    job = submit_lines(ctx, [completion_line("first", "Hello"), completion_line("second", "World")],
                       completion_window="1h")
    units = dispatch(ctx)
    _run_units(ctx, generator, units[:1])
    assert lifecycle.sweep_jobs(ctx, now=time.time() + 60).expired == []
    assert lifecycle.sweep_jobs(ctx, now=time.time() + 7200).expired == [job.id]
    job = service.get(ctx, job.id)
    assert job.status == "expired" and (job.completed, job.failed) == (1, 1)
    assert [o["custom_id"] for o in read_output(ctx, job.id)] == ["first"]
    assert [(e["custom_id"], e["error"]["code"]) for e in read_output(ctx, job.id, errors=True)] == [
        ("second", "batch_expired")]


def test_jobs_on_postgres_and_s3_complete_with_output_in_input_order(make_context, postgres_url, s3_url, generator):
    ctx = make_context(database_url=postgres_url, storage_url=s3_url)
    first = submit_lines(ctx, [chat_line("a1", "Hi"), completion_line("a2", "Paris is")])
    second = submit_lines(ctx, [completion_line("b1", "Rome is"), chat_line("b2", "Hello"), chat_line("b3", "Yo")])
    units = dispatch(ctx)
    assert sum(u.num_requests for u in units) == 5
    _run_units(ctx, generator, units)
    for job, ids in ((first, ["a1", "a2"]), (second, ["b1", "b2", "b3"])):
        job = service.get(ctx, job.id)
        assert job.status == "completed" and job.completed == len(ids) and job.error_key is None
        lines = read_output(ctx, job.id)
        assert [o["custom_id"] for o in lines] == ids
        usage = [o["response"]["body"]["usage"] for o in lines]
        assert job.prompt_tokens == sum(u["prompt_tokens"] for u in usage) > 0
        assert job.completion_tokens == sum(u["completion_tokens"] for u in usage) > 0
        assert all(o["metrics"]["worker"] == "test-worker" and o["metrics"]["e2e_s"] > 0 for o in lines)
        assert {o["metrics"]["weight_format"] for o in lines} == {generator.description.weight_format}
    assert [j.id for j in service.list_jobs(ctx)] == [second.id, first.id]


@pytest.mark.fast
def test_unknown_jobs_are_reported(make_context):
    with pytest.raises(JobNotFound):
        service.get(make_context(), "batch_nope")


@pytest.mark.fast
def test_every_submit_is_checked_alike_metadata_window_and_active_limit(make_context):
    """The CLI's submit passes the checks the API's create does (jobs.intake.submission), not a subset."""
    ctx = make_context(max_active_batches_per_owner=1)
    lines = [completion_line("a", "x")]
    with pytest.raises(InvalidRequest, match="Expected an object with at most 16 properties, but got an object with 17"):
        submit_lines(ctx, lines, metadata={f"k{i}": "v" for i in range(17)})
    with pytest.raises(InvalidRequest, match="metadata keys are at most 64"):
        submit_lines(ctx, lines, metadata={"k" * 65: "v"})
    for window in ("soon", ""):  # never empty: a window we serve
        with pytest.raises(InvalidRequest, match="Supported values are: '24h'") as refused:
            submit_lines(ctx, lines, completion_window=window)
        assert (refused.value.code, refused.value.param) == ("invalid_value", "completion_window")
    first = submit_lines(ctx, lines)
    with pytest.raises(TooManyActive, match="1 unfinished batches; the limit is 1"):
        submit_lines(ctx, lines)
    service.cancel(ctx, first.id)
    assert submit_lines(ctx, lines).status == "queued"  # a finished batch no longer counts


def test_n_samples_come_back_as_choices_with_the_prompt_counted_once(make_context, generator):
    ctx = make_context()
    job = submit_lines(ctx, [completion_line("four", "Once upon a time", max_tokens=3, n=4, temperature=1.0, seed=5,
                                             ignore_eos=True),
                             completion_line("one", "Once upon a time", max_tokens=3, temperature=1.0, seed=5,
                                             ignore_eos=True)])
    _run_units(ctx, generator, dispatch(ctx))
    four, one = (o["response"]["body"] for o in read_output(ctx, job.id))
    assert [c["index"] for c in four["choices"]] == [0, 1, 2, 3]
    assert four["choices"][0]["text"] == one["choices"][0]["text"]  # sample 0 keeps the line's seed
    assert four["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert four["usage"]["completion_tokens"] == 4 * 3  # ignore_eos: 3 tokens each sample
    assert service.get(ctx, job.id).completion_tokens == four["usage"]["completion_tokens"] + one["usage"]["completion_tokens"]
