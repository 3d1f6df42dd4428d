"""Several models in one fleet, without services: a batch takes the model its lines name, validation refuses a
model nobody serves (naming the served ones), dispatch plans and routes each model apart, and a line's unset
sampling comes from its checkpoint's generation_config.json. Tiny tokenizer folders, SQLite and local files."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from batchinfer.jobs.dispatch.routing import WorkerLoad, model_queue, worker_queue
from batchinfer.db.models import Request, WorkUnit
from batchinfer.jobs import record_store
from batchinfer.jobs.records import PreparedRequest
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.planner import PlannerConfig
from jobfiles import chat_line, completion_line, submit_lines
from tiny_model import build_tiny_model

pytestmark = pytest.mark.fast
DEFAULT = "smollm2-135m-instruct"  # the id make_settings' tiny model is served as
OTHER = "tiny-2"
SHARED = "You are a helpful assistant. Answer the question briefly. " * 6  # a prefix group (> 64 tokens)


@pytest.fixture
def fleet(make_context, tmp_path):
    """A context whose configuration serves two models: its own and OTHER (a second tiny folder)."""
    other = build_tiny_model(tmp_path / "other")
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                              "repetition_penalty": 1.05, "do_sample": True}))
    return make_context(models={OTHER: str(other)})


def _prepared(ctx, job_id: str) -> list[PreparedRequest]:
    return [r for _, r in sorted(record_store.read_prepared(ctx.storage, job_id).items())]


def test_a_batch_takes_the_model_its_lines_name(fleet):
    job = submit_lines(fleet, [chat_line("a", "hi", model=OTHER), completion_line("b", "hello", model=OTHER)])
    assert job.status == "queued" and job.model == OTHER
    assert {p.model for p in _prepared(fleet, job.id)} == {OTHER}


def test_a_line_naming_another_served_model_is_refused_as_mismatched(fleet):
    job = submit_lines(fleet, [chat_line("a", "hi", model=OTHER), chat_line("b", "hi"), chat_line("c", "hi", model="gpt-x")],
                       skip_invalid=True)
    assert job.status == "queued" and job.model == OTHER
    errors = {e["line"]: e for e in job.errors}
    assert set(errors) == {2, 3} and errors[2]["code"] == "mismatched_model" and DEFAULT in errors[2]["message"]
    assert errors[3]["code"] == "model_not_found" and f"(served here: '{DEFAULT}', '{OTHER}')" in errors[3]["message"]


def test_a_batch_naming_a_model_nobody_serves_fails_naming_each_line_and_the_served_list(fleet):
    job = submit_lines(fleet, [chat_line("a", "hi", model="gpt-4o"), chat_line("b", "hi"), "{broken"], skip_invalid=True)
    assert job.status == "failed" and job.model == "gpt-4o"
    assert job.errors[0] == {"line": 1, "code": "model_not_found", "param": "body.model",
                             "message": "The provided model 'gpt-4o' is not supported by the Batch API (served here: "
                                        f"'{DEFAULT}', '{OTHER}')."}
    assert [(e["line"], e["code"]) for e in job.errors[1:]] == [(2, "mismatched_model"), (3, "invalid_json_line")]
    assert dispatch(fleet) == []


def test_unset_sampling_comes_from_the_checkpoints_generation_config(fleet):
    job = submit_lines(fleet, [json.dumps({"custom_id": "unset", "method": "POST", "url": "/v1/completions",
                                           "body": {"model": OTHER, "prompt": "hi", "max_tokens": 2}}),
                               completion_line("set", "hi", model=OTHER, temperature=0.2, top_p=1, top_k=-1)])
    unset, given = (p.sampling for p in _prepared(fleet, job.id))
    assert (unset.temperature, unset.top_p, unset.top_k, unset.repetition_penalty) == (0.6, 0.9, 20, 1.05)
    assert (given.temperature, given.top_p, given.top_k, given.repetition_penalty) == (0.2, 1.0, 0, 1.05)
    default = submit_lines(fleet, [json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/completions",
                                               "body": {"prompt": "hi", "max_tokens": 2}})])
    (plain,) = (p.sampling for p in _prepared(fleet, default.id))  # no generation_config sampling: OpenAI's
    assert default.model == DEFAULT and (plain.temperature, plain.top_p, plain.top_k) == (1.0, 1.0, 0)


def test_dispatch_plans_each_model_apart_and_routes_to_its_workers(fleet):
    """The same prompts in two models' batches share no unit; each unit goes to its model's worker or queue."""
    prompts = [SHARED + f"Question {i}?" for i in range(4)] + ["lone"]
    mine = submit_lines(fleet, [json.dumps({"custom_id": f"d{i}", "method": "POST", "url": "/v1/completions",
                                            "body": {"prompt": p, "max_tokens": 2}}) for i, p in enumerate(prompts)])
    other = submit_lines(fleet, [completion_line(f"o{i}", p, model=OTHER) for i, p in enumerate(prompts)])
    loads = [WorkerLoad("w-default", model=DEFAULT), WorkerLoad("w-other", model=OTHER)]
    units = dispatch(fleet, [w.name for w in loads], PlannerConfig(max_requests_per_unit=4), worker_loads=loads)
    with fleet.sessions() as session:
        rows = {u.id: u for u in session.scalars(select(WorkUnit))}
        jobs_of = {u: set(session.scalars(select(Request.job_id).where(Request.unit_id == u))) for u in rows}
    assert all(jobs_of[u] == ({other.id} if rows[u].model == OTHER else {mine.id}) for u in rows)  # never mixed
    by_model: dict[str, set[str]] = {}
    for unit in units:
        by_model.setdefault(rows[unit.unit_id].model, set()).add(unit.queue)
    assert by_model[DEFAULT] <= {worker_queue("w-default"), model_queue(DEFAULT)}
    assert by_model[OTHER] <= {worker_queue("w-other"), model_queue(OTHER)}
    assert worker_queue("w-other") in by_model[OTHER] and model_queue(OTHER) in by_model[OTHER]  # group; lone
    assert sum(u.num_requests for u in units) == 10 and mine.model == DEFAULT and other.model == OTHER


def test_a_plan_uses_its_models_tokenizer_and_workers(fleet):
    import io

    from batchinfer.cluster.registry import WorkerState
    from batchinfer.runtime.preview import summary

    source = io.BytesIO(("\n".join(completion_line(f"p{i}", "hello there", model=OTHER) for i in range(3)) + "\n").encode())
    plan = summary(fleet, source, [WorkerState("w-default", model=DEFAULT), WorkerState("w-other", model=OTHER)])
    assert plan["ok"] and plan["requests"] == 3 and plan["workers"] == 1, plan


def test_a_served_model_whose_tokenizer_is_missing_here_fails_its_batch_naming_no_path(make_context, tmp_path):
    ctx = make_context(models={"ghost": str(tmp_path / "nowhere")})
    job = submit_lines(ctx, [chat_line("a", "hi", model="ghost")])
    assert job.status == "failed" and len(job.errors) == 1
    message = job.errors[0]["message"]
    assert "model 'ghost' is served, but its tokenizer is not readable" in message and "nowhere" not in message
