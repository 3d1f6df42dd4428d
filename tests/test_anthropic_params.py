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
                  _request("tools", tools=[{"name": "t"}]), _request("hot", temperature=1.5),
                  _request("prefill", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "H"}]),
                  _request("image", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                  _request("nope", model="claude-x"))
    report, valid, invalid = _validate(tiny_tokenizer, data)
    assert [v.custom_id for v in valid] == ["ok"]
    sampling = valid[0].request.sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.stop) == (4, 3, ("\n",))
    assert tiny_tokenizer.decode(valid[0].request.prompt_token_ids).count("Be terse.") == 1
    assert [(e.custom_id, e.code, e.param) for e in invalid] == [
        ("tools", "unsupported_parameter", "body.tools"), ("hot", "decimal_above_max_value", "body.temperature"),
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
