import pytest
from sqlalchemy import select

from batchinfer.jobs import service
from batchinfer.db.models import Request, WorkUnit
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.planner import PlannerConfig
from jobfiles import chat_line, completion_line
from jobfiles import submit_lines

pytestmark = pytest.mark.fast  # validated with the tiny tokenizer (make_settings), SQLite and local files
SHARED = "Answer in one word, as a careful assistant who reads the whole question first. " * 4  # > 64 tokens


def test_pending_requests_of_all_queued_jobs_are_planned_once(make_context):
    ctx = make_context()
    a = submit_lines(ctx, [completion_line("a1", SHARED + "Sky?"), completion_line("a2", SHARED + "Grass?")])
    b = submit_lines(ctx, [completion_line("b1", "x")])
    units = dispatch(ctx, ["w1"], PlannerConfig(max_requests_per_unit=2))
    assert sum(u.num_requests for u in units) == 3
    with ctx.sessions() as session:
        rows = session.execute(select(Request.job_id, Request.status, Request.unit_id)).all()
        unit_rows = session.scalars(select(WorkUnit)).all()
        ids = {u.queue: sorted(session.scalars(select(Request.custom_id).where(Request.unit_id == u.unit_id)))
               for u in units}
    # The group sharing SHARED goes to the only live worker's own queue; the lone request to its model's queue.
    assert ids == {"batchinfer.worker.w1": ["a1", "a2"], "batchinfer.model.smollm2-135m-instruct": ["b1"]}
    assert {r.job_id for r in rows} == {a.id, b.id} and all(r.status == "planned" and r.unit_id for r in rows)
    assert {u.id for u in unit_rows} == {u.unit_id for u in units}
    assert all(ctx.storage.exists(u.input_key) for u in unit_rows)
    assert dispatch(ctx, ["w1"]) == []


def test_units_mix_jobs_and_respect_the_planner_limits(make_context):
    ctx = make_context()
    submit_lines(ctx, [completion_line(f"a{i}", "same prefix") for i in range(3)])
    submit_lines(ctx, [completion_line(f"b{i}", "same prefix") for i in range(3)])
    units = dispatch(ctx, [], PlannerConfig(max_requests_per_unit=4))
    assert [u.num_requests for u in units] == [4, 2]
    with ctx.sessions() as session:
        jobs_in_first = set(session.scalars(select(Request.job_id).where(Request.unit_id == units[0].unit_id)))
    assert len(jobs_in_first) == 2


def test_cancelled_and_failed_jobs_are_not_planned(make_context):
    ctx = make_context()
    job = submit_lines(ctx, [chat_line("a", "hi")])
    service.cancel(ctx, job.id)
    submit_lines(ctx, ["not json"])
    assert dispatch(ctx) == []


def test_the_planner_shares_prefixes_in_the_engines_kv_blocks(make_context):
    from batchinfer.engine import EngineConfig
    from batchinfer.jobs.dispatch.planning import planner_config
    from batchinfer.runtime.engine_host import engine_config

    ctx = make_context(kv_block_size=32)
    assert planner_config(ctx).block_size == engine_config(ctx.settings).block_size == 32
    default = make_context()
    assert planner_config(default).block_size == engine_config(default.settings).block_size == EngineConfig().block_size


def test_a_prepared_part_not_in_index_order_is_read_whole(make_context):
    """The store parses only the pending lines when request `index` is on line `index` of its part (as validation
    writes them); a part in any other order is read whole, and nothing pending is left out."""
    from batchinfer.jobs import record_store

    ctx = make_context()
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(5)])
    assert record_store.read_prepared(ctx.storage, job.id, {1, 3}).keys() == {1, 3}
    prepared = record_store.read_prepared(ctx.storage, job.id)
    record_store.store_part(ctx.storage, job.id, 0, [prepared[i].to_json() + b"\n" for i in reversed(range(5))])
    assert {i: r.index for i, r in record_store.read_prepared(ctx.storage, job.id, {1, 3}).items()} == {1: 1, 3: 3}
    units = dispatch(ctx, [], PlannerConfig(max_requests_per_unit=8))
    assert sum(u.num_requests for u in units) == 5
    with ctx.sessions() as session:
        assert set(session.scalars(select(Request.status).where(Request.job_id == job.id))) == {"planned"}


def test_a_job_an_earlier_version_prepared_in_one_file_still_dispatches(make_context):
    """Before prepared parts, a job's prepared requests were one file, each line holding its custom_id too."""
    from batchinfer.jobs import record_store
    from batchinfer.jobs.records import dumps

    ctx = make_context()
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(3)])
    prepared = record_store.read_prepared(ctx.storage, job.id)
    ctx.storage.delete(f"jobs/{job.id}/prepared-parts/000000.jsonl")
    with ctx.storage.open_write(f"jobs/{job.id}/prepared.jsonl") as out:
        for i, req in sorted(prepared.items()):
            out.write(dumps({**req.to_dict(), "line": i + 1, "custom_id": f"c{i}"}) + b"\n")
    units = dispatch(ctx, [], PlannerConfig(max_requests_per_unit=8))
    assert sum(u.num_requests for u in units) == 3


def test_a_deep_backlog_is_cut_into_bigger_units_spread_over_every_worker(make_context):
    from batchinfer.planner.unit_size import UNITS_PER_WORKER

    ctx = make_context(max_requests_per_unit=2, unit_growth=3)
    lines = [completion_line(f"r{i}", f"question {i}") for i in range(UNITS_PER_WORKER * 2 * 3)]
    submit_lines(ctx, lines)
    one_worker = dispatch(ctx, ["w1"])  # 3 base units a worker's share: units of 6
    assert {u.num_requests for u in one_worker} == {6} and sum(u.num_requests for u in one_worker) == len(lines)
    ctx = make_context(max_requests_per_unit=2, unit_growth=3, data_dir=ctx.settings.data_dir / "again")
    submit_lines(ctx, lines)
    two_workers = dispatch(ctx, ["w1", "w2"])  # 1.5 base units each: the base size
    assert {u.num_requests for u in two_workers} == {2}


def test_a_file_still_validated_is_sized_by_the_rows_it_has_so_far():
    """A streamed round sees only what the last rounds left pending; the file's rows so far (its highest pending
    index + 1, each file) are what its units are sized by, so a long file's units grow from its first rounds."""
    from batchinfer.planner import PendingRequest
    from batchinfer.jobs.dispatch.planning import _backlog

    members = [PendingRequest("a", i, (1,), 1) for i in (900, 950)] + [PendingRequest("b", 10, (1,), 1)]
    assert _backlog(members, growing=False) == 3
    assert _backlog(members, growing=True) == 951 + 11


def test_a_claim_on_sqlite_keeps_what_moved_when_a_request_changed_under_it(make_context, monkeypatch):
    """SQLite locks no row for the claim's SELECT: a request that left `pending` between it and the UPDATE (a
    validation that started over dropped it, say) is not planned, and the unit holds what moved; a unit left
    holding nothing is not recorded. The embedded server once stopped its runs on this (ClaimMismatch)."""
    from sqlalchemy import delete

    from batchinfer.jobs.state import table

    ctx = make_context()
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:") for i in range(3)])
    real = table.move_each

    def one_dropped_meanwhile(session, t, rows, *args, **kwargs):
        session.execute(delete(Request).where(Request.job_id == job.id, Request.index == 0))
        return real(session, t, rows, *args, **kwargs)

    monkeypatch.setattr(table, "move_each", one_dropped_meanwhile)
    (unit,) = dispatch(ctx, [], PlannerConfig(max_requests_per_unit=8))
    with ctx.sessions() as session:
        assert unit.num_requests == session.get(WorkUnit, unit.unit_id).num_requests == 2
        assert sorted(session.scalars(select(Request.index).where(Request.unit_id == unit.unit_id))) == [1, 2]


def test_lines_of_two_adapters_sharing_a_prompt_are_planned_in_two_groups(make_context):
    """The line's model names its adapter (the batch's model is the base): one group per adapter, each routed by
    its own key, never one group whose KV the engine could not share."""
    ctx = make_context(adapters={"tuned-a": "/x", "tuned-b": "/y"})
    lines = [completion_line(f"{m}{i}", SHARED + f"Item {i}?", model=m)
             for m in ("tuned-a", "tuned-b", "smollm2-135m-instruct") for i in range(3)]
    submit_lines(ctx, lines)
    units = dispatch(ctx, [], PlannerConfig(max_requests_per_unit=3))
    with ctx.sessions() as session:
        keys = {u.unit_id: session.get(WorkUnit, u.unit_id).prefix_key for u in units}
        ids = {keys[u.unit_id]: sorted(session.scalars(select(Request.custom_id).where(Request.unit_id == u.unit_id)))
               for u in units}
    assert sorted(ids.values()) == [[f"{m}{i}" for i in range(3)] for m in ("smollm2-135m-instruct", "tuned-a", "tuned-b")]
    assert "" not in ids and len(ids) == 3


def test_an_adapter_s_group_is_sent_to_the_worker_that_holds_the_adapter_loaded(make_context):
    from batchinfer.jobs.dispatch.routing import WorkerLoad, rendezvous_order

    ctx = make_context(adapters={"tuned-a": "/x", "tuned-b": "/y"})
    submit_lines(ctx, [completion_line(f"b{i}", SHARED + f"Item {i}?", model="tuned-b") for i in range(3)])
    workers = sorted(f"w{i}" for i in range(4))
    holder = next(w for w in rendezvous_order("any-key", workers) if w != rendezvous_order("lora\0tuned-b", workers)[0])
    loads = [WorkerLoad(w, adapters=frozenset({"tuned-b"} if w == holder else ())) for w in workers]
    units = dispatch(ctx, workers, PlannerConfig(max_requests_per_unit=8), worker_loads=loads)
    assert [(u.queue, u.num_requests) for u in units] == [(f"batchinfer.worker.{holder}", 3)]
    with ctx.sessions() as session:
        key = session.get(WorkUnit, units[0].unit_id).prefix_key
    assert rendezvous_order(key, workers)[0] != holder  # by its prefix key alone it would go elsewhere
