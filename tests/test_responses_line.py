"""`/v1/responses` lines: what validation accepts and refuses, and the Response body the openai SDK parses."""
import io
import json

import pytest
from openai.types.responses import Response

from batchinfer.engine.types import GenerationResult
from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs.intake.lines import ValidationLimits, validate_stream

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.fast  # a tiny real tokenizer (tests/tiny_model.py), no model


def responses_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                       "body": {"model": MODEL, **body}})


def _validate(tokenizer, lines: list[str]):
    valid, invalid = [], []
    limits = ValidationLimits(model_id=MODEL, max_model_len=8192)
    report = validate_stream(io.BytesIO(("\n".join(lines) + "\n").encode()), tokenizer, limits, valid.append,
                             invalid.append)
    return report, valid, invalid


def test_string_input_and_message_items_are_the_same_prompt(tiny_tokenizer):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    report, valid, _ = _validate(tiny_tokenizer, [
        responses_line("s", input="Hi", instructions="Be brief.", max_output_tokens=5, temperature=0.5, top_p=0.9,
                       metadata={"k": "v"}, store=False),
        responses_line("m", input=items)])
    assert report.ok and [v.custom_id for v in valid] == ["s", "m"]
    assert valid[0].request.prompt_token_ids == valid[1].request.prompt_token_ids
    assert "Be brief." in tiny_tokenizer.decode(valid[0].request.prompt_token_ids)
    sampling = valid[0].request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (5, 0.5, 0.9)
    assert valid[0].request.echo["metadata"] == {"k": "v"} and valid[0].request.echo["instructions"] == "Be brief."


@pytest.mark.parametrize("body, param, code", [
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "body.tools", "invalid_value"),  # a built-in tool
    ({"input": "Hi", "tools": [{"type": "function", "name": "f g"}]}, "body.tools", "invalid_value"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "body.tool_choice", "invalid_value"),
    ({"input": "Hi", "reasoning": {"effort": "low"}}, "body.reasoning", "unsupported_parameter"),
    ({"input": "Hi", "previous_response_id": "resp_1"}, "body.previous_response_id", "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "body.input", "invalid_value"),
    ({"input": "Hi", "max_output_tokens": 0}, "body.max_output_tokens", "integer_below_min_value"),
    ({"input": "Hi", "stream": "yes"}, "body.stream", "invalid_value"),
    ({"input": ""}, "body.input", "invalid_value"),
    ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "body.text", "invalid_value"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "body.text", "invalid_value"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "required": 5}}}},
     "body.text.format", "invalid_value"),  # a schema the grammar library cannot compile, found at submit time
])
def test_unsupported_or_bad_fields_are_the_requests_own_400(tiny_tokenizer, body, param, code):
    report, valid, invalid = _validate(tiny_tokenizer, [responses_line("ok", input="Hi"), responses_line("bad", **body)])
    assert [v.custom_id for v in valid] == ["ok"] and report.ok
    (error,) = invalid
    assert error.custom_id == "bad" and error.param == param and error.per_request
    assert error.code == code
    named = param.removeprefix("body.").removesuffix(".format")  # OpenAI's "Invalid value: 'x'. Supported values..."
    assert named in error.message or error.message.startswith("Invalid value: ")  # names the value, the param names it


@pytest.mark.parametrize("body, param, code", [
    ({"input": "Hi", "stream": True}, "body.stream", "streaming_unsupported"),
    ({"instructions": "x"}, "body.input", "invalid_request"),
])
def test_a_stream_or_no_input_fails_the_batch(tiny_tokenizer, body, param, code):
    report, valid, invalid = _validate(tiny_tokenizer, [responses_line("ok", input="Hi"), responses_line("bad", **body)])
    assert [v.custom_id for v in valid] == ["ok"] and not report.ok
    assert [(e.code, e.param, e.per_request) for e in invalid] == [(code, param, False)]


def test_the_output_body_is_a_response_the_sdk_parses():
    result = GenerationResult("r", [1, 2, 3], "Hello there", "length", prompt_tokens=7, cached_tokens=4,
                              arrival_time=100.0, first_scheduled_time=100.0, first_token_time=100.5,
                              last_token_time=101.0)
    echo = {"instructions": "Be brief.", "metadata": {"k": "v"}, "max_output_tokens": 3, "temperature": None,
            "top_p": None}
    line = formats.output_line("batch_x", 0, "c", "/v1/responses", MODEL, [result], "w", echo)
    response = Response.model_validate(line["response"]["body"])
    assert response.object == "response" and response.status == "incomplete" and response.output_text == "Hello there"
    assert response.incomplete_details.reason == "max_output_tokens" and response.metadata == {"k": "v"}
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens, usage.total_tokens) == (
        7, 4, 3, 10)


SCHEMA = {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}, "required": ["label"]}


def test_text_format_holds_the_output_to_a_schema_and_the_response_repeats_it(tiny_tokenizer):
    fmt = {"type": "json_schema", "name": "label", "schema": SCHEMA, "strict": True}
    report, valid, _ = _validate(tiny_tokenizer, [responses_line("s", input="Hi", text={"format": fmt}),
                                                  responses_line("o", input="Hi", text={"format": {"type": "json_object"}}),
                                                  responses_line("t", input="Hi", text={"format": {"type": "text"}})])
    assert report.ok
    assert [v.request.sampling.guided for v in valid] == [("json_schema", json.dumps(SCHEMA, sort_keys=True)),
                                                  ("json_object", ""), None]
    result = GenerationResult("r", [1], '{"label": "yes"}', "stop", 3, 0, 1.0, 1.0, 1.0, 2.0)
    body = formats.output_line("b", 0, "s", "/v1/responses", MODEL, [result], "w", valid[0].request.echo)["response"]["body"]
    response = Response.model_validate(body)
    assert response.text is not None and response.text.format.type == "json_schema"
    assert json.loads(response.output_text) == {"label": "yes"}


ADD = {"type": "function", "name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


def test_function_call_items_render_as_the_chat_conversation_they_are(tiny_tokenizer):
    from batchinfer.jobs.endpoints.chat import ChatBody
    from batchinfer.jobs.endpoints.responses import ResponsesBody

    body = ResponsesBody.model_validate({"instructions": "Be brief.", "tools": [ADD], "input": [
        {"role": "user", "content": "1+2, 3+4?"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 3, "b": 4}'},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"type": "function_call_output", "call_id": "c2", "output": "7"}]})
    chat = ChatBody.model_validate({"tools": [{"type": "function", "function": {k: v for k, v in ADD.items() if k != "type"}}],
                                    "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2, 3+4?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}, {"role": "tool", "tool_call_id": "c2", "content": "7"}]})
    assert body.prompt_text(tiny_tokenizer) == chat.prompt_text(tiny_tokenizer)


def test_a_forced_call_comes_back_as_a_function_call_item_the_sdk_parses(tiny_tokenizer):
    from openai.types.responses import Response

    from batchinfer.jobs.endpoints.responses import ResponsesBody, result_body

    body = ResponsesBody.model_validate({"input": "1+2?", "tools": [ADD], "tool_choice": {"type": "function", "name": "add"},
                                         "max_output_tokens": 16})
    assert body.params(16).guided[0] == "tool_calls" and body.constraints_given() == ["tool_choice"]

    class Result:
        text, finish_reason, arrival_time = '{"a": 1, "b": 2}', "stop", 1796582057.0
        prompt_tokens, completion_tokens, cached_tokens = 9, 8, 0

    parsed = Response.model_validate(result_body("abc", MODEL, Result(), body.echo(tiny_tokenizer)))
    (call,) = parsed.output
    assert (call.type, call.name, call.call_id, call.arguments) == ("function_call", "add", "call_abc_0", '{"a": 1, "b": 2}')
    assert parsed.tools[0].name == "add" and parsed.tool_choice.name == "add" and parsed.parallel_tool_calls is True
