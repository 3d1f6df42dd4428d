"""Anthropic's Message Batches API as code written against Anthropic meets it: the stock `anthropic` client against a
real `batchinfer serve` and worker (PostgreSQL, Redis, S3, the real model).

Anthropic's split: create checks the requests' shape (a custom_id of its pattern, used once; params an object) and
refuses the whole batch naming the field; each request's params are checked as the batch is processed, a bad one
ending `errored` (invalid_request_error; not_found_error for an unknown model) while the rest run. Counts always sum
to the batch's size; errors are Anthropic's {"type": "error", "error": {"type", "message"}}.
"""
from __future__ import annotations

import time

import anthropic
import pytest

from api_stack import MODEL, serve_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_cache, postgres_server, redis_server, s3_server, s3_bucket):
    with serve_stack(tmp_path_factory.mktemp("conformance-anthropic"), model_cache, postgres_server, redis_server,
                     s3_server, s3_bucket) as running:
        yield running


@pytest.fixture
def client(stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=stack.new_key(), max_retries=0)


def request(custom_id: str, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": MODEL, "max_tokens": 2, "temperature": 0,
                                               "messages": [{"role": "user", "content": "Say hi."}], **params}}


def wait_ended(c: anthropic.Anthropic, batch_id: str, timeout: float = 240):
    deadline = time.time() + timeout
    while (batch := c.messages.batches.retrieve(batch_id)).processing_status != "ended":
        assert time.time() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(0.3)
    return batch


def refused(call) -> tuple[int, str, str]:
    with pytest.raises(anthropic.APIStatusError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return caught.value.status_code, body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize("requests, named", [
    ([], "requests"),
    ([request("ok"), {"custom_id": "has space", "params": {}}], "requests.1.custom_id"),
    ([request("ok"), {"custom_id": "x" * 65, "params": {}}], "requests.1.custom_id"),
    ([request("same"), request("same")], "requests.1.custom_id"),
    ([request("ok"), {"custom_id": "no-params"}], "requests.1.params"),
    ([request("ok"), {"custom_id": "text", "params": "Say hi."}], "requests.1.params"),
])
def test_create_refuses_a_batch_whose_requests_are_malformed_naming_the_field(client, requests, named):
    status, kind, message = refused(lambda: client.messages.batches.create(requests=requests))
    assert (status, kind) == (400, "invalid_request_error") and named in message


def test_each_request_with_bad_params_ends_errored_alone_while_the_rest_succeed(client):
    bad = {  # custom_id: (params, the error type, what its message names)
        "tools": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "invalid_request_error", "'tools'"),
        "hot": ({"temperature": 1.5}, "invalid_request_error", "'temperature'"),
        "no-max-tokens": ({"max_tokens": None}, "invalid_request_error", "max_tokens"),
        "stream": ({"stream": True}, "invalid_request_error", "Streaming is not supported"),
        "prefill": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "H"}]},
                    "invalid_request_error", "prefill"),
        "model": ({"model": "claude-nonexistent"}, "not_found_error", "claude-nonexistent"),
        "too-long": ({"max_tokens": 9000}, "invalid_request_error", "maximum context length"),
    }
    requests = [request("ok")] + [request(custom_id, **params) for custom_id, (params, _, _) in bad.items()]
    for r in requests:
        r["params"] = {k: v for k, v in r["params"].items() if v is not None}
    created = client.messages.batches.create(requests=requests)
    assert created.processing_status == "in_progress" and sum(created.request_counts.to_dict().values()) == len(requests)
    batch = wait_ended(client, created.id)
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 1, len(bad), 0, 0)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert sorted(results) == sorted(r["custom_id"] for r in requests)
    ok = results.pop("ok")
    assert ok.type == "succeeded" and ok.message.role == "assistant" and ok.message.usage.output_tokens >= 1
    for custom_id, result in results.items():
        _, kind, named = bad[custom_id]
        assert result.type == "errored" and result.error.error.type == kind, (custom_id, result)
        assert named in result.error.error.message, (custom_id, result.error.error.message)


def test_lifecycle_errors_are_anthropics(client):
    status, kind, _ = refused(lambda: client.messages.batches.retrieve("msgbatch_nonexistent"))
    assert (status, kind) == (404, "not_found_error")
    batch = client.messages.batches.create(requests=[request(f"r{i}", max_tokens=16) for i in range(4)])
    status, kind, message = refused(lambda: client.messages.batches.delete(batch.id))  # still processing
    assert (status, kind) == (400, "invalid_request_error") and "cancel" in message
    client.messages.batches.cancel(batch.id)
    ended = wait_ended(client, batch.id)
    counts = ended.request_counts
    assert counts.processing == 0 and counts.succeeded + counts.canceled == 4 and ended.ended_at
    assert client.messages.batches.cancel(batch.id).processing_status == "ended"  # cancelling again changes nothing
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    status, kind, _ = refused(lambda: client.messages.batches.retrieve(batch.id))
    assert (status, kind) == (404, "not_found_error")
