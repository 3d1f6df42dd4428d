"""A batch of tool lines on the default model (SmolLM2, whose template takes no tools: the generic format) through
the job system: every line whose tool_choice is required or names a function comes back with calls whose arguments
validate against their function's parameters, and the openai SDK parses every output line."""
from __future__ import annotations

import json

import jsonschema
from openai.types.chat import ChatCompletion

from batchinfer.jobs import service
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.units.runner import run_unit
from jobfiles import chat_line, read_output, submit_lines

WEATHER = {"type": "function", "function": {"name": "get_current_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"},
                                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
QUESTIONS = ["What is the weather like in Paris?", "How much is 17 plus 25?", "Is it raining in Tokyo today?",
             "Add 3 and 4 for me."]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_current_weather"}},
           "single": "required"}


def _lines() -> list[str]:
    lines = []
    for k, question in enumerate(QUESTIONS):
        for kind, choice in CHOICES.items():
            extra = {"parallel_tool_calls": False} if kind == "single" else {}
            lines.append(chat_line(f"{kind}-{k}", question, 96, tools=[WEATHER, ADD], tool_choice=choice, **extra))
        lines.append(chat_line(f"auto-{k}", question, 24, tools=[WEATHER, ADD]))
    return lines


def test_required_and_named_tool_lines_come_back_with_valid_calls(make_context, generator):
    ctx = make_context(max_requests_per_unit=64)
    job = submit_lines(ctx, _lines())
    for unit in dispatch(ctx):
        run_unit(ctx, unit.unit_id, generator, "test-worker")
    assert service.get(ctx, job.id).status == "completed"
    outputs = read_output(ctx, job.id)
    assert sorted(o["custom_id"] for o in outputs) == sorted(json.loads(line)["custom_id"] for line in _lines())
    for out in outputs:
        kind = out["custom_id"].split("-")[0]
        choice = ChatCompletion.model_validate(out["response"]["body"]).choices[0]
        if kind == "auto":  # the model chooses: a message or calls, either parses
            continue
        # with parallel calls allowed the small model may repeat calls up to max_tokens: the complete ones are kept
        assert choice.finish_reason in (("tool_calls", "length") if kind == "required" else ("tool_calls",)), choice
        calls = choice.message.tool_calls
        assert calls and choice.message.content is None and (len(calls) == 1 or kind == "required"), choice
        for call in calls:
            assert kind != "named" or call.function.name == "get_current_weather"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
