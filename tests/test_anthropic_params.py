"""A Message Batch's requests as our input lines (jobs/endpoints/anthropic.py): create checks what Anthropic checks at
create (custom_id, params an object, unique ids); the params are checked at validation, each request failing alone."""
from __future__ import annotations

import io
import json

import pytest

from batchinfer.errors import InvalidRequest
from batchinfer.jobs.endpoints import anthropic
from batchinfer.jobs.intake.lines import ValidationLimits, validate_stream

pytestmark = pytest.mark.fast  # a tiny real tokenizer (tests/tiny_model.py), no model

MODEL = "smollm2-135m-instruct"


def _request(custom_id: str, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": MODEL, "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "Hi"}], **params}}


def _validate(tokenizer, data: bytes, endpoint: str | None = anthropic.MESSAGES_ENDPOINT):
    valid, invalid = [], []
    limits = ValidationLimits(model_id=MODEL, max_model_len=8192, endpoint=endpoint, served_models=(MODEL,))
    return validate_stream(io.BytesIO(data), tokenizer, limits, valid.append, invalid.append), valid, invalid


def _lines(*requests: dict) -> bytes:
    raw = json.dumps({"requests": list(requests)}).encode()
    return anthropic.input_lines(anthropic.parse_create(raw, 100))


def test_create_keeps_bad_params_for_validation_and_each_fails_alone(tiny_tokenizer):
    data = _lines(_request("ok", system=[{"type": "text", "text": "Be terse."}], stop_sequences=["\n"], top_k=3),
                  _request("thinking", thinking={"type": "enabled", "budget_tokens": 1024}), _request("hot", temperature=1.5),
                  _request("prefill", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "H"}]),
                  _request("image", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                  _request("nope", model="claude-x"))
    report, valid, invalid = _validate(tiny_tokenizer, data)
    assert [v.custom_id for v in valid] == ["ok"]
    sampling = valid[0].request.sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.stop) == (4, 3, ("\n",))
    assert tiny_tokenizer.decode(valid[0].request.prompt_token_ids).count("Be terse.") == 1
    assert [(e.custom_id, e.code, e.param) for e in invalid] == [
        ("thinking", "unsupported_parameter", "body.thinking"), ("hot", "decimal_above_max_value", "body.temperature"),
        ("prefill", "invalid_value", "body.messages"), ("image", "invalid_value", "body.messages[0].content"),
        ("nope", "model_not_found", "body.model")]
    assert [e.per_request for e in invalid] == [True, True, True, True, False]  # the model: skip_invalid runs the rest
    results = [anthropic.result({"error": {"code": e.code, "message": e.message}}) for e in invalid]
    assert [r["error"]["error"]["type"] for r in results] == ["invalid_request_error"] * 4 + ["not_found_error"]


@pytest.mark.parametrize("body, where", [
    ({"requests": [{"custom_id": "a b", "params": {}}]}, "requests.0.custom_id"),
    ({"requests": [{"custom_id": "a", "params": "x"}]}, "requests.0.params"),
    ({"requests": [{"custom_id": "a", "params": {}, "other": 1}]}, "requests.0.other"),
    ({"requests": []}, "requests"),
    ({"requests": [_request("a"), _request("a")]}, "requests.1.custom_id"),
])
def test_create_refuses_what_anthropic_refuses_at_create(body, where):
    with pytest.raises(InvalidRequest, match=where.replace(".", r"\.")):
        anthropic.parse_create(json.dumps(body).encode(), 100)


def test_message_lines_go_only_in_a_message_batch(tiny_tokenizer):
    report, valid, invalid = _validate(tiny_tokenizer, _lines(_request("a")), endpoint="/v1/chat/completions")
    assert not valid and [(e.code, e.param) for e in invalid] == [("invalid_url", "url")]
    chat = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}}).encode()
    report, valid, invalid = _validate(tiny_tokenizer, chat)
    assert not valid and [(e.code, e.param) for e in invalid] == [("invalid_url", "url")]


def test_a_refused_request_is_errored_and_a_succeeded_one_a_message():
    refused = {"custom_id": "r", "response": {"status_code": 400, "body": {"error": {"message": "m"}}},
               "error": {"code": "invalid_value", "message": "m"}}
    assert anthropic.result(refused)["type"] == "errored"
    body = {"id": "chatcmpl-x", "model": MODEL, "choices": [{"message": {"content": "Hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    succeeded = anthropic.result({"custom_id": "s", "response": {"status_code": 200, "body": body}, "error": None})
    assert succeeded["type"] == "succeeded" and succeeded["message"]["content"][0]["text"] == "Hello"


WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_a_conversation_with_tool_use_and_tool_result_renders_as_its_chat_equivalent(tiny_tokenizer):
    from batchinfer.jobs.endpoints.chat import ChatBody

    params = anthropic.Params.model_validate({"model": MODEL, "max_tokens": 8, "system": "Be brief.", "tools": [WEATHER],
                                              "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "And so?"}]}]})
    chat = ChatBody.model_validate({"tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER["input_schema"]}}], "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}, {"role": "user", "content": "And so?"}]})
    assert params.prompt_text(tiny_tokenizer) == chat.prompt_text(tiny_tokenizer)
    assert "<tool_response>\nsunny\n</tool_response>" in params.prompt_text(tiny_tokenizer)


@pytest.mark.parametrize("params,param,says", [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "body.tools", "tool 0: each tool must be a custom tool"),
    ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "body.tools", "tool 0 ('bad name')"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "body.tool_choice", "must name one of tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "body.tool_choice.type", "auto"),
])
def test_a_bad_tool_request_ends_errored_naming_the_problem(tiny_tokenizer, params, param, says):
    report, valid, invalid = _validate(tiny_tokenizer, _lines(_request("t", **params)))
    assert not valid and [(e.code, e.param) for e in invalid] == [(invalid[0].code, param)] and says in invalid[0].message


def test_a_forced_tool_choice_is_a_grammar_and_its_calls_come_back_as_tool_use_blocks():
    params = anthropic.Params.model_validate({"model": MODEL, "max_tokens": 8, "tools": [WEATHER],
                                              "messages": [{"role": "user", "content": "Hi"}],
                                              "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert params.params(8).guided[0] == "tool_calls" and params.constraints_given() == ["tool_choice"]
    body = {"id": "chatcmpl-x", "model": MODEL, "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_x_0_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                "finish_reason": "tool_calls"}]}
    message = anthropic.message(body)
    assert message["stop_reason"] == "tool_use" and message["content"] == [
        {"type": "tool_use", "id": "toolu_x_0_0", "name": "get_weather", "input": {"city": "Oslo"}}]
    from anthropic.types import Message

    assert Message.model_validate(message).content[0].input == {"city": "Oslo"}
