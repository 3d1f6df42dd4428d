"""A labelling batch through the job system on the real model: 200 lines over four JSON schemas (enums, nested
objects, arrays, required fields), each completed output parses and validates with jsonschema. The control (the
same lines without response_format) is recorded, not asserted."""
from __future__ import annotations

import json
import time

import jsonschema

from batchinfer.jobs import service
from batchinfer.runtime.dispatch import dispatch
from batchinfer.runtime.unit_runner import run_unit
from jobfiles import read_output, submit_lines

LABELS = ["positive", "negative", "neutral"]
SCHEMAS = {
    "sentiment": {"type": "object", "properties": {"label": {"enum": LABELS}}, "required": ["label"],
                  "additionalProperties": False},
    "entity": {"type": "object", "properties": {"entity": {
        "type": "object", "properties": {"kind": {"enum": ["person", "place", "thing"]}, "named": {"type": "boolean"}},
        "required": ["kind", "named"], "additionalProperties": False}}, "required": ["entity"],
        "additionalProperties": False},
    "topics": {"type": "object", "properties": {"topics": {"type": "array", "items": {"enum": ["food", "travel", "work"]},
                                                           "minItems": 1, "maxItems": 2}},
               "required": ["topics"], "additionalProperties": False},
    "rating": {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                                "urgent": {"type": "boolean"}},
               "required": ["score", "urgent"], "additionalProperties": False},
}
SUBJECTS = ["The hotel", "My flight", "Anna from Porto", "The soup", "The Friday meeting", "This pizza", "The train",
            "Our new manager", "The museum", "The delivery"]
VERDICTS = ["was wonderful.", "was late again.", "was fine, nothing special.", "made me angry.", "surprised us all."]
MAX_TOKENS = 48


def lines(constrained: bool) -> list[str]:
    out = []
    for name, schema in SCHEMAS.items():
        ask = f"Answer only with JSON matching this schema: {json.dumps(schema)}"
        for i, (s, v) in enumerate((s, v) for s in SUBJECTS for v in VERDICTS):
            fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                                               "strict": True}}} if constrained else {}
            out.append(json.dumps({"custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": "smollm2-135m-instruct", "max_tokens": MAX_TOKENS, "temperature": 0,
                                            "messages": [{"role": "system", "content": ask},
                                                         {"role": "user", "content": f"{s} {v}"}], **fmt}}))
    return out


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_job(ctx, generator, constrained: bool) -> list[dict]:
    job = submit_lines(ctx, lines(constrained))
    for unit in dispatch(ctx):
        run_unit(ctx, unit.unit_id, generator, "test-worker")
    assert service.get(ctx, job.id).status == "completed"
    return read_output(ctx, job.id)


def test_a_labelling_batch_over_four_schemas_validates_every_completed_output(make_context, generator):
    assert len(lines(True)) == 200
    ctx = make_context(max_requests_per_unit=64)
    started = time.perf_counter()
    outputs = run_job(ctx, generator, constrained=True)
    constrained_s = time.perf_counter() - started
    assert len(outputs) == 200
    completed = 0
    for out in outputs:
        choice = out["response"]["body"]["choices"][0]
        schema = SCHEMAS[out["custom_id"].rsplit("-", 1)[0]]
        if choice["finish_reason"] == "stop":
            completed += 1
            assert valid(choice["message"]["content"], schema), (out["custom_id"], choice["message"]["content"])
    assert completed >= 150, f"only {completed}/200 finished inside max_tokens"
    started = time.perf_counter()
    control = run_job(ctx, generator, constrained=False)
    control_s = time.perf_counter() - started
    failed = sum(not valid(o["response"]["body"]["choices"][0]["message"]["content"],
                           SCHEMAS[o["custom_id"].rsplit("-", 1)[0]]) for o in control)
    print(f"\nconstrained: {completed}/200 completed, all valid ({constrained_s:.1f} s); "
          f"control without response_format: {failed}/200 fail to validate ({control_s:.1f} s)")
