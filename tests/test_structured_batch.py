"""A labelling batch through the job system on the real model: 200 lines over four JSON schemas (enums, a nested
object, an array, required fields; benchmarks/support/labelling.py), every completed output parses and validates
with jsonschema. The control (the first lines of each schema without response_format) is recorded, not asserted."""
from __future__ import annotations

import time

from batchinfer.jobs import service
from batchinfer.runtime.dispatch import dispatch
from batchinfer.runtime.unit_runner import run_unit
from benchmarks.support.labelling import batch_lines, schema_of, validates
from jobfiles import read_output, submit_lines

PER_SCHEMA, MAX_TOKENS = 50, 32
CONTROL_PER_SCHEMA = 10  # the control is a recorded share, not a check: a fifth of the lines says it


def run_job(ctx, generator, constrained: bool, per_schema: int = PER_SCHEMA) -> list[dict]:
    job = submit_lines(ctx, batch_lines(per_schema, MAX_TOKENS, constrained))
    for unit in dispatch(ctx):
        run_unit(ctx, unit.unit_id, generator, "test-worker")
    assert service.get(ctx, job.id).status == "completed"
    return read_output(ctx, job.id)


def test_a_labelling_batch_over_four_schemas_validates_every_completed_output(make_context, generator):
    ctx = make_context(max_requests_per_unit=64)
    started = time.perf_counter()
    outputs = run_job(ctx, generator, constrained=True)
    constrained_s = time.perf_counter() - started
    assert len(outputs) == 4 * PER_SCHEMA
    completed = 0
    for out in outputs:
        choice = out["response"]["body"]["choices"][0]
        if choice["finish_reason"] == "stop":
            completed += 1
            assert validates(choice["message"]["content"], schema_of(out["custom_id"])), (out["custom_id"], choice)
    assert completed >= 0.5 * len(outputs), f"only {completed}/{len(outputs)} finished inside max_tokens"
    started = time.perf_counter()
    control = run_job(ctx, generator, constrained=False, per_schema=CONTROL_PER_SCHEMA)
    control_s = time.perf_counter() - started
    failed = sum(not validates(o["response"]["body"]["choices"][0]["message"]["content"], schema_of(o["custom_id"]))
                 for o in control)
    print(f"\nconstrained: {completed}/{len(outputs)} completed, all valid ({constrained_s:.1f} s); "
          f"control without response_format: {failed}/{len(control)} fail to validate ({control_s:.1f} s)")
