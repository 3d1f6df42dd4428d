"""Anthropic's Message Batches API end to end, driven by the official `anthropic` SDK against a real
`batchinfer serve` and worker (the `api` fixture of test_api: PostgreSQL, Redis, S3, the real model)."""
from __future__ import annotations

import time

import anthropic
import httpx
import pytest

from test_api import api, new_key  # noqa: F401  (api is the module's server fixture)

MODEL = "smollm2-135m-instruct"


def client(api, key: str) -> anthropic.Anthropic:  # noqa: F811
    return anthropic.Anthropic(base_url=api[0], api_key=key, max_retries=0)


def request(custom_id: str, text: str, max_tokens: int = 4, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                                               "messages": [{"role": "user", "content": text}], **params}}


def wait_ended(c: anthropic.Anthropic, batch_id: str, timeout: float = 240):
    deadline = time.time() + timeout
    while True:
        batch = c.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.time() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(0.3)


def test_create_poll_results_and_delete(api):  # noqa: F811
    c = client(api, new_key(api))
    created = c.messages.batches.create(requests=[
        request("plain", "Hi!", system="You are terse."),
        request("blocks", "Count: one, two,", stop_sequences=["\n\n"], top_k=5, top_p=0.9,
                system=[{"type": "text", "text": "Answer."}]),
        request("other-model", "Hi!", model="claude-sonnet-4"),
        request("stopper", "Hi!", max_tokens=8, stop_sequences=["e", "zzz"]),  # any greeting has an "e"
    ])
    assert created.id.startswith("msgbatch_") and created.processing_status == "in_progress"
    assert sum(created.request_counts.to_dict().values()) == 4 and created.results_url is None
    batch = wait_ended(c, created.id)
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing, counts.canceled, counts.expired) == (3, 1, 0, 0, 0)
    assert batch.ended_at and batch.results_url
    results = {r.custom_id: r.result for r in c.messages.batches.results(batch.id)}
    assert sorted(results) == ["blocks", "other-model", "plain", "stopper"]
    stopped = results["stopper"].message
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "e") and "e" not in stopped.content[0].text
    for custom_id in ("plain", "blocks"):
        result = results[custom_id]
        assert result.type == "succeeded"
        message = result.message
        assert message.role == "assistant" and message.model == MODEL and message.content[0].type == "text"
        assert message.stop_reason in ("end_turn", "max_tokens") and 1 <= message.usage.output_tokens <= 4
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    errored = results["other-model"]
    assert errored.type == "errored" and errored.error.error.type == "not_found_error"
    assert "model" in errored.error.error.message
    assert c.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        c.messages.batches.retrieve(batch.id)


def test_cancel_ends_with_canceled_requests_counted(api):  # noqa: F811
    c = client(api, new_key(api))
    ids = [f"r{i}" for i in range(8)]
    created = c.messages.batches.create(requests=[request(i, f"Count to {n + 5}.", max_tokens=16)
                                                  for n, i in enumerate(ids)])
    with pytest.raises(anthropic.BadRequestError):  # still processing: cancel it first
        c.messages.batches.delete(created.id)
    cancelling = c.messages.batches.cancel(created.id)
    assert cancelling.processing_status in ("canceling", "ended") and cancelling.cancel_initiated_at
    batch = wait_ended(c, created.id)
    counts = batch.request_counts
    assert counts.canceled > 0 and counts.processing == 0 and counts.succeeded + counts.canceled == len(ids)
    results = list(c.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == ids
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    assert {r.result.type for r in results} <= {"succeeded", "canceled"}
    assert c.messages.batches.cancel(batch.id).processing_status == "ended"  # cancelling again changes nothing
    c.messages.batches.delete(batch.id)


def test_tenants_see_only_their_own_batches(api):  # noqa: F811
    mine, theirs = client(api, new_key(api, "mine")), client(api, new_key(api, "theirs"))
    batch = mine.messages.batches.create(requests=[request("only", "Hi!", max_tokens=2)])
    for call in (theirs.messages.batches.retrieve, theirs.messages.batches.cancel, theirs.messages.batches.delete):
        with pytest.raises(anthropic.NotFoundError):
            call(batch.id)
    response = httpx.get(f"{api[0]}/v1/messages/batches/{batch.id}/results", headers={"x-api-key": theirs.api_key})
    assert response.status_code == 404 and response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "not_found_error"
    assert batch.id not in [b.id for b in theirs.messages.batches.list()]
    assert batch.id in [b.id for b in mine.messages.batches.list()]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=api[0], api_key="sk-wrong", max_retries=0).messages.batches.list()
    wait_ended(mine, batch.id)


def test_list_pages_newest_first(api):  # noqa: F811
    c = client(api, new_key(api))
    made = [c.messages.batches.create(requests=[request("x", "Hi!", max_tokens=1)]).id for _ in range(3)]
    first = c.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    assert [b.id for b in c.messages.batches.list(limit=2, after_id=first.last_id).data] == made[:1]
    assert [b.id for b in c.messages.batches.list(limit=2, before_id=made[0]).data] == made[::-1][:2]
    assert [b.id for b in c.messages.batches.list(limit=1)] == made[::-1]  # the SDK follows the pages
    for batch_id in made:
        wait_ended(c, batch_id)


BAD_PARAMS = {  # custom_id: (params, what the error names)
    "tools": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "'tools'"),
    "thinking": ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "'thinking'"),
    "image": ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content"),
    "hot": ({"temperature": 1.5}, "'temperature'"),
    "prefill": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]}, "prefill"),
}


def test_bad_params_end_errored_naming_the_field_while_the_rest_run(api):  # noqa: F811
    """Anthropic's split: create checks custom_id and that params is an object; the params themselves are checked
    as the batch is processed, each bad request an `errored` result of its own."""
    c = client(api, new_key(api))
    batch = c.messages.batches.create(requests=[request("ok", "Hi!")] + [request(custom_id, "Hi!", **params)
                                                                         for custom_id, (params, _) in BAD_PARAMS.items()])
    batch = wait_ended(c, batch.id)
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (1, len(BAD_PARAMS))
    results = {r.custom_id: r.result for r in c.messages.batches.results(batch.id)}
    assert results.pop("ok").type == "succeeded"
    for custom_id, result in results.items():
        assert result.type == "errored" and result.error.error.type == "invalid_request_error", custom_id
        assert BAD_PARAMS[custom_id][1] in result.error.error.message, (custom_id, result.error.error.message)


def test_a_request_without_params_is_refused_at_create_naming_it(api):  # noqa: F811
    c = client(api, new_key(api))
    with pytest.raises(anthropic.BadRequestError) as caught:
        c.messages.batches.create(requests=[request("ok", "Hi!"), {"custom_id": "bad", "params": "Hi!"}])
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "requests.1.params" in body["error"]["message"]


def test_duplicate_custom_ids_are_refused(api):  # noqa: F811
    c = client(api, new_key(api))
    with pytest.raises(anthropic.BadRequestError) as caught:
        c.messages.batches.create(requests=[request("same", "Hi!"), request("same", "Hello!")])
    assert "requests.1.custom_id" in caught.value.body["error"]["message"]


WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_tool_lines_come_back_as_tool_use_blocks_the_sdk_parses(api):  # noqa: F811
    c = client(api, new_key(api))
    asked = "What is the weather in Paris?"
    follow_up = [{"role": "user", "content": asked},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                    "input": {"city": "Paris"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    batch = c.messages.batches.create(requests=[
        request("any", asked, 48, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        request("named", asked, 48, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}),
        {"custom_id": "result", "params": {"model": MODEL, "max_tokens": 8, "tools": [WEATHER], "messages": follow_up}}])
    wait_ended(c, batch.id)
    results = {r.custom_id: r.result for r in c.messages.batches.results(batch.id)}
    for custom_id in ("any", "named"):
        message = results[custom_id].message
        assert message.stop_reason == "tool_use", message
        (block,) = [b for b in message.content if b.type == "tool_use"]
        assert block.name == "get_weather" and isinstance(block.input["city"], str) and block.id.startswith("toolu_")
    assert results["result"].type == "succeeded"
