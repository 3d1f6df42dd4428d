"""A labelling batch through the job system on the real model: 100 lines over four JSON schemas (enums, a nested
object, an array, required fields; benchmarks/support/labelling.py), every completed output parses and validates
with jsonschema. How often the lines fail without response_format is the bench's figure (`batchinfer bench
constrained`), not this test's."""
from __future__ import annotations

from batchinfer.jobs import service
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.units.runner import run_unit
from benchmarks.support.labelling import batch_lines, schema_of, validates
from jobfiles import read_output, submit_lines

PER_SCHEMA, MAX_TOKENS = 25, 32


def run_job(ctx, generator) -> list[dict]:
    job = submit_lines(ctx, batch_lines(PER_SCHEMA, MAX_TOKENS, constrained=True))
    for unit in dispatch(ctx):
        run_unit(ctx, unit.unit_id, generator, "test-worker")
    assert service.get(ctx, job.id).status == "completed"
    return read_output(ctx, job.id)


def test_a_labelling_batch_over_four_schemas_validates_every_completed_output(make_context, generator):
    ctx = make_context(max_requests_per_unit=64)
    outputs = run_job(ctx, generator)
    assert len(outputs) == 4 * PER_SCHEMA
    completed = 0
    for out in outputs:
        choice = out["response"]["body"]["choices"][0]
        if choice["finish_reason"] == "stop":
            completed += 1
            assert validates(choice["message"]["content"], schema_of(out["custom_id"])), (out["custom_id"], choice)
    assert completed >= 0.5 * len(outputs), f"only {completed}/{len(outputs)} finished inside max_tokens"
