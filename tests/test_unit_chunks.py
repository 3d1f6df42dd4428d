"""Chunked commits of a running unit (jobs.units.chunks, state.units.commit_chunk) on a real PostgreSQL: a chunk
counts only while its run owns the unit, a rerun runs only what no chunk holds, and two runs that both hold a
request write it once."""
from __future__ import annotations

from batchinfer.db.models import UnitStatus
from batchinfer.jobs import record_store, service
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import units
from batchinfer.jobs.units import runner as unit_runner
from batchinfer.jobs.units.runner import run_unit
from jobfiles import completion_line, read_output, submit_lines


def _unit_job(ctx, n=3):
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(n)])
    (unit,) = dispatch(ctx)
    return job, unit.unit_id


def _run_by_hand(ctx, unit_id, worker, generator):
    started = units.start_unit(ctx, unit_id, worker)
    requests = unit_runner._load_requests(ctx, unit_id, started.to_run)
    return started.attempt, unit_runner._generate(requests, generator, worker, None)


def _chunk(ctx, unit_id, attempt, seq, records):
    key = record_store.store_results(ctx.storage, unit_id, attempt, records, chunk=seq)
    return units.commit_chunk(ctx, unit_id, attempt, seq, key, records, [])


def test_a_rerun_runs_only_what_no_chunk_holds_and_a_replaced_runs_chunk_counts_nothing(make_context, postgres_url,
                                                                                         generator):
    ctx = make_context(database_url=postgres_url)
    job, unit_id = _unit_job(ctx)
    attempt, records = _run_by_hand(ctx, unit_id, "wa", generator)
    first, second, _ = sorted(records)
    assert _chunk(ctx, unit_id, attempt, 1, {first: records[first]}) == 1
    assert service.get(ctx, job.id).completed == 1  # counted as soon as the chunk commits
    assert units.send_again(ctx, unit_id, UnitStatus.RUNNING, attempt, "its worker was lost")
    outcome = run_unit(ctx, unit_id, generator, "wb")  # the rerun: attempt 2
    assert outcome.committed and outcome.completed == 2  # not the chunked request
    assert _chunk(ctx, unit_id, attempt, 2, {second: records[second]}) is None  # the old run: fenced off
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == ("completed", 3, 0)
    assert [(o["custom_id"], o["metrics"]["worker"]) for o in read_output(ctx, job.id)] == \
        [("c0", "wa"), ("c1", "wb"), ("c2", "wb")]


def test_a_run_that_commits_after_anothers_chunk_counts_and_writes_each_request_once(make_context, postgres_url,
                                                                                    generator):
    ctx = make_context(database_url=postgres_url)
    job, unit_id = _unit_job(ctx)
    attempt_a, slow = _run_by_hand(ctx, unit_id, "wa", generator)  # a run the sweep gave up on, still going
    attempt_b, fast = _run_by_hand(ctx, unit_id, "wb", generator)
    first = min(fast)
    assert _chunk(ctx, unit_id, attempt_b, 1, {first: fast[first]}) == 1
    key = record_store.store_results(ctx.storage, unit_id, attempt_a, slow)  # its file holds the chunked request too
    late = unit_runner._commit(ctx, unit_id, key, slow)
    assert late.committed and late.completed == 2  # the chunked request is not counted again
    assert try_finalize(ctx, job.id)
    job = service.get(ctx, job.id)
    assert (job.status, job.completed, job.failed) == ("completed", 3, 0)
    outputs = read_output(ctx, job.id)
    assert sorted(o["custom_id"] for o in outputs) == ["c0", "c1", "c2"]  # one line each, though two files hold c0
