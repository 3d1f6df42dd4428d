"""OpenAI's Batch API as code written against OpenAI meets it: the stock `openai` client against a real
`batchinfer serve` and worker (PostgreSQL, Redis, S3, the real model).

Each expectation is OpenAI's documented or recorded behaviour: a file or envelope problem fails the batch at
validation with every bad line named (code, line, param); a body the endpoint refuses is that request's own 400 in
the error file while the rest runs, and the counts add up; OpenAI's codes and wording; OpenAI's lifecycle (an
unknown file makes a failed batch, idempotency keys, result files that can be deleted). Where we serve more on
purpose (docs/endpoints.md, "Where we differ from OpenAI"), the test says so.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time

import httpx
import openai
import pytest
from openai.types import Batch

from api_stack import MODEL, serve_stack

FINAL = ("completed", "failed", "cancelled", "expired")
MAX_REQUESTS, MAX_LINE_BYTES = 20, 4000
INTERNAL_WORDS = re.compile(r"\b(job|unit|worker)s?\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_cache, postgres_server, redis_server, s3_server, s3_bucket):
    with serve_stack(tmp_path_factory.mktemp("conformance-openai"), model_cache, postgres_server, redis_server,
                     s3_server, s3_bucket, BATCHINFER_MAX_REQUESTS_PER_FILE=str(MAX_REQUESTS),
                     BATCHINFER_MAX_LINE_BYTES=str(MAX_LINE_BYTES), BATCHINFER_MAX_REQUESTS_PER_UNIT="4",
                     BATCHINFER_API_CONCURRENT_UPLOADS="8") as running:
        yield running


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.new_key(), max_retries=0)


def line(custom_id: str, url: str = "/v1/chat/completions", **body) -> dict:
    prompt = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2},
              "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 2},
              "/v1/responses": {"input": "Say hi.", "max_output_tokens": 2},
              "/v1/embeddings": {"input": "Hello world"}}[url]
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": MODEL, **prompt, "temperature": 0, **body} if url != "/v1/embeddings"
            else {"model": MODEL, **prompt, **body}}


def upload(c: openai.OpenAI, lines: list, **kwargs) -> str:
    text = "\n".join(raw if isinstance(raw, str) else json.dumps(raw) for raw in lines)
    return c.files.create(file=("batch.jsonl", text.encode()), purpose="batch", **kwargs).id


def create(c: openai.OpenAI, lines: list, endpoint: str = "/v1/chat/completions", **kwargs) -> Batch:
    return c.batches.create(input_file_id=upload(c, lines), endpoint=endpoint, completion_window="24h", **kwargs)


def wait_final(c: openai.OpenAI, batch_id: str, timeout: float = 240) -> Batch:
    deadline = time.time() + timeout
    while (batch := c.batches.retrieve(batch_id)).status not in FINAL:
        assert time.time() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.3)
    return batch


def lines_of(c: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [json.loads(raw) for raw in c.files.content(file_id).text.splitlines()] if file_id else []


def errors_of(batch: Batch) -> list[tuple]:
    assert batch.errors is not None
    for e in batch.errors.data:
        assert e.message and not INTERNAL_WORDS.search(e.message), e.message
    return [(e.line, e.code, e.param) for e in batch.errors.data]


def counts(batch: Batch) -> tuple[int, int, int]:
    c = batch.request_counts
    assert c is not None and c.completed + c.failed == c.total  # the counts add up
    return c.total, c.completed, c.failed


def status_error(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    error = caught.value.body
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert not INTERNAL_WORDS.search(error["message"]), error["message"]
    return caught.value


# ---- validation: a file or envelope problem fails the batch, every bad line named ------------------------------

def test_every_file_and_envelope_problem_fails_the_batch_each_named_with_line_code_and_param(client):
    good = line("good")
    lines = [
        good,                                                                                   # 1
        "{not json",                                                                            # 2
        "[1, 2]",                                                                               # 3
        {k: v for k, v in line("x").items() if k != "custom_id"},                               # 4
        {k: v for k, v in line("no-method").items() if k != "method"},                          # 5
        {k: v for k, v in line("no-url").items() if k != "url"},                                # 6
        {k: v for k, v in line("no-body").items() if k != "body"},                              # 7
        {**line("get"), "method": "GET"},                                                       # 8
        {**line("x"), "custom_id": 7},                                                          # 9
        line("embed", "/v1/embeddings"),                                                        # 10
        {**line("moderation"), "url": "/v1/moderations"},                                       # 11
        line("good"),                                                                           # 12
        line("stream", stream=True),                                                            # 13
        line("model", model="nonexistent-model-xyz"),                                           # 14
        {**line("no-model"), "body": {"messages": [{"role": "user", "content": "Hi"}]}},        # 15
        {**line("no-messages"), "body": {"model": MODEL}},                                      # 16
        line("hot", temperature=9),                                                             # 17 a body problem
        line("long", messages=[{"role": "user", "content": "x" * MAX_LINE_BYTES}]),             # 18
    ]
    data = ("\n".join(raw if isinstance(raw, str) else json.dumps(raw) for raw in lines) + "\n").encode() + b"\xff\n"  # 19
    file_id = client.files.create(file=("bad.jsonl", data), purpose="batch").id
    batch = wait_final(client, client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert errors_of(batch) == [
        (2, "invalid_json_line", None), (3, "invalid_request", None),
        (4, "missing_required_parameter", "custom_id"), (5, "missing_required_parameter", "method"),
        (6, "missing_required_parameter", "url"), (7, "missing_required_parameter", "body"),
        (8, "invalid_value", "method"), (9, "invalid_type", "custom_id"), (10, "invalid_url", "url"),
        (11, "invalid_url", "url"), (12, "duplicate_custom_id", "custom_id"), (13, "streaming_unsupported", "body.stream"),
        (14, "model_not_found", "body.model"), (15, "invalid_request", "body.model"),
        (16, "invalid_request", "body.messages"), (18, "line_too_long", None), (19, "invalid_json_line", None)]
    by_line = {e.line: e.message for e in batch.errors.data}
    assert by_line[2].startswith("This line is not parseable as valid JSON")
    assert by_line[4] == "Missing required parameter: 'custom_id'."
    assert by_line[8] == "Invalid value: 'GET'. Supported values are: 'POST'."
    assert by_line[9] == "Invalid type for 'custom_id': expected a string, but got an integer instead."
    assert by_line[10].startswith("The URL provided for this request does not match the batch endpoint")
    assert by_line[12].startswith("The custom_id for this request is a duplicate of another request.")
    assert by_line[13] == "Chat Completions: Streaming is not supported in the Batch API."
    assert by_line[14].startswith("The provided model 'nonexistent-model-xyz' is not supported by the Batch API")
    assert (by_line[15], by_line[16]) == ("Model parameter is required.", "Messages parameter is required.")
    c = batch.request_counts  # ours: every line counted, the bad ones as failed (OpenAI's stay 0 when validation fails)
    assert (c.total, c.completed, c.failed) == (19, 0, 18)


@pytest.mark.parametrize("lines, expected", [
    ([], (None, "empty_file", None)),
    ([line(f"r{i}") for i in range(MAX_REQUESTS + 1)], (MAX_REQUESTS + 1, "too_many_requests", None)),
])
def test_a_problem_of_the_whole_file_fails_the_batch(client, lines, expected):
    batch = wait_final(client, create(client, lines).id)
    assert batch.status == "failed" and errors_of(batch) == [expected]


def test_an_unknown_input_file_makes_a_batch_that_fails_naming_file_id(client):
    created = client.batches.create(input_file_id="file-nonexistent-xyz", endpoint="/v1/chat/completions",
                                    completion_window="24h")
    assert created.input_file_id == "file-nonexistent-xyz" and created.status in ("validating", "failed")
    batch = wait_final(client, created.id)
    assert batch.status == "failed" and errors_of(batch) == [(None, "invalid_request", "file_id")]
    assert batch.errors.data[0].message.startswith("Cannot find file 'file-nonexistent-xyz'")


# ---- the per-line split: a refused body is that request's own 400, the rest runs -------------------------------

SPLIT = {  # endpoint: (the refused body's line, its code, the param as the endpoint names it)
    "/v1/chat/completions": (line("bad", messages=[{"rolez": "user", "contentz": "Hi"}]), "missing_required_parameter",
                             "messages[0].role"),
    "/v1/completions": (line("bad", "/v1/completions", max_tokens=0), "integer_below_min_value", "max_tokens"),
    "/v1/responses": (line("bad", "/v1/responses", reasoning={"effort": "low"}), "unsupported_parameter",
                      "reasoning"),
    "/v1/embeddings": (line("bad", "/v1/embeddings", dimensions=0), "integer_below_min_value", "dimensions"),
}


@pytest.mark.parametrize("endpoint", list(SPLIT))
def test_a_refused_body_fails_alone_with_its_400_while_the_rest_runs(client, endpoint):
    bad, code, param = SPLIT[endpoint]
    batch = wait_final(client, create(client, [line("first", endpoint), bad, line("last", endpoint)], endpoint).id)
    assert batch.status == "completed" and batch.errors is None  # OpenAI's: the batch completes
    assert counts(batch) == (3, 2, 1)
    out = lines_of(client, batch.output_file_id)
    assert [o["custom_id"] for o in out] == ["first", "last"]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    (refused,) = lines_of(client, batch.error_file_id)
    assert refused["custom_id"] == "bad" and refused["id"].startswith("batch_req_")
    response = refused["response"]
    assert response["status_code"] == 400 and response["request_id"]
    error = response["body"]["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert error["message"] and not INTERNAL_WORDS.search(error["message"])
    # ours beside OpenAI's (docs/endpoints.md): `error` repeats it with the line, where OpenAI's is null
    assert (refused["error"]["code"], refused["error"]["line"], refused["error"]["param"]) == (code, 2, f"body.{param}")


def test_every_code_of_a_refused_body(client):
    bodies = {  # custom_id: (body fields, code, param)
        "type": ({"temperature": "hot"}, "invalid_type", "temperature"),
        "role": ({"messages": [{"role": "robot", "content": "Hi"}]}, "invalid_value", "messages[0].role"),
        "content": ({"messages": [{"role": "user"}]}, "missing_required_parameter", "messages[0].content"),
        "too-hot": ({"temperature": 3}, "decimal_above_max_value", "temperature"),
        "few-tokens": ({"max_tokens": 0}, "integer_below_min_value", "max_tokens"),
        "many-logprobs": ({"logprobs": True, "top_logprobs": 21}, "integer_above_max_value", "top_logprobs"),
        "functions": ({"functions": [{"name": "f"}]}, "unsupported_parameter", "functions"),
        "bad-tool": ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "invalid_value", "tools"),
        "no-messages": ({"messages": []}, "empty_array", "messages"),
        "empty-regex": ({"guided_regex": ""}, "empty_string", "guided_regex"),
        "many-choices": ({"guided_choice": [str(i) for i in range(301)]}, "array_above_max_length", "guided_choice"),
        "long": ({"max_tokens": 9000}, "context_length_exceeded", "messages"),
    }
    batch = wait_final(client, create(client, [line("ok")] + [line(custom_id, **body)
                                                              for custom_id, (body, _, _) in bodies.items()]).id)
    assert batch.status == "completed" and counts(batch) == (len(bodies) + 1, 1, len(bodies))
    refused = {e["custom_id"]: e["response"] for e in lines_of(client, batch.error_file_id)}
    found = {custom_id: (r["status_code"], r["body"]["error"]["code"], r["body"]["error"]["param"])
             for custom_id, r in refused.items()}
    assert found == {custom_id: (400, code, param) for custom_id, (_, code, param) in bodies.items()}
    assert refused["content"]["body"]["error"]["message"] == "Missing required parameter: 'messages[0].content'."
    assert refused["type"]["body"]["error"]["message"] == ("Invalid type for 'temperature': expected a number, but got "
                                                           "a string instead.")
    assert refused["long"]["body"]["error"]["message"].startswith("This model's maximum context length is 8192 tokens.")


# ---- the HTTP API's own errors -------------------------------------------------------------------------------------

def test_create_refuses_what_openai_refuses_with_its_codes(client):
    file_id = upload(client, [line("a")])
    bad = status_error(lambda: client.batches.create(input_file_id=file_id, endpoint="/v1/invalid/endpoint",
                                                     completion_window="24h"))
    assert (bad.status_code, bad.code, bad.param) == (400, "invalid_value", "endpoint")
    assert bad.body["message"].startswith("Invalid value: '/v1/invalid/endpoint'. Supported values are: "
                                          "'/v1/chat/completions', '/v1/completions', '/v1/embeddings', and '/v1/responses'.")
    for window in ("", "invalid", "0h"):  # never empty: a window we serve
        bad = status_error(lambda: client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                         completion_window=window))  # noqa: B023
        assert (bad.status_code, bad.code, bad.param) == (400, "invalid_value", "completion_window"), window
    bad = status_error(lambda: client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                     completion_window="24h", metadata={"tags": ["a", "b"]}))
    assert (bad.status_code, bad.code, bad.param) == (400, "invalid_type", "metadata.tags")
    assert bad.body["message"] == "Invalid type for 'metadata.tags': expected a string, but got an array instead."
    bad = status_error(lambda: client.post("/batches", cast_to=Batch, body={"endpoint": "/v1/chat/completions"}))
    assert (bad.code, bad.param, bad.body["message"]) == ("missing_required_parameter", "input_file_id",
                                                          "Missing required parameter: 'input_file_id'.")
    # ours (docs/endpoints.md): any window up to BATCHINFER_MAX_COMPLETION_WINDOW, where OpenAI takes only 24h
    assert client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                 completion_window="48h").completion_window == "2d"


def test_unknown_ids_answer_404_in_openais_words(client):
    missing = status_error(lambda: client.batches.retrieve("batch-nonexistent-xyz"))
    assert missing.status_code == 404 and missing.body["message"] == "No batch found with id 'batch-nonexistent-xyz'."
    missing = status_error(lambda: client.batches.cancel("batch-nonexistent-xyz"))
    assert missing.status_code == 404 and missing.body["message"] == "No batch found with id 'batch-nonexistent-xyz'."
    missing = status_error(lambda: client.files.retrieve("file-nonexistent-xyz"))
    assert missing.status_code == 404 and missing.body["message"] == "No such File object: 'file-nonexistent-xyz'."


def test_cancel_follows_openais_lifecycle(client):
    batch = create(client, [line(f"r{i}", max_tokens=16) for i in range(6)])
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and isinstance(cancelling.cancelling_at, int)
    final = wait_final(client, batch.id)
    assert final.status == "cancelled" and isinstance(final.cancelled_at, int)
    again = client.batches.cancel(batch.id)  # cancelling a cancelled batch answers with it as it is
    assert (again.status, again.cancelled_at) == ("cancelled", final.cancelled_at)
    done = wait_final(client, create(client, [line("one")]).id)
    assert done.status == "completed"
    refused = status_error(lambda: client.batches.cancel(done.id))
    assert refused.status_code == 409 and refused.body["message"] == "Cannot cancel a batch with status 'completed'."


# ---- idempotency keys: the body's idempotency_key and the Idempotency-Key header are one thing -----------------

def test_the_same_key_and_body_return_the_same_batch_and_another_body_409(client):
    file_id = upload(client, [line("a")])
    first = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"a": "1", "b": "2"}, extra_body={"idempotency_key": "k-1"})
    again = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"b": "2", "a": "1"}, extra_headers={"Idempotency-Key": "k-1"})
    assert (again.id, again.created_at, again.metadata) == (first.id, first.created_at, first.metadata)
    conflict = status_error(lambda: client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                          completion_window="24h", metadata={"a": "other"},
                                                          extra_body={"idempotency_key": "k-1"}))
    assert conflict.status_code == 409 and "conflict" in conflict.body["message"].lower()
    assert conflict.param == "idempotency_key"
    both = status_error(lambda: client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                      completion_window="24h", extra_body={"idempotency_key": "k-2"},
                                                      extra_headers={"Idempotency-Key": "k-3"}))
    assert (both.status_code, both.param) == (400, "idempotency_key")
    unknown = client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h",
                                    extra_body={"idempotency_key": "k-4"})
    assert client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h",
                                 extra_body={"idempotency_key": "k-4"}).id == unknown.id  # the failed batch, once
    mine = {b.id for b in client.batches.list(limit=100)}
    assert len(mine) == 2 and wait_final(client, first.id).status == "completed"


def test_concurrent_retries_under_one_key_make_one_batch_and_one_file(client):
    content = json.dumps(line("a")).encode()

    def upload_once(_):
        return client.files.create(file=("same.jsonl", content), purpose="batch",
                                   extra_headers={"Idempotency-Key": "file-key"}).id

    with cf.ThreadPoolExecutor(6) as pool:
        file_ids = set(pool.map(upload_once, range(6)))
    assert len(file_ids) == 1 and [f.id for f in client.files.list()] == list(file_ids)
    other = status_error(lambda: client.files.create(file=("same.jsonl", b"{}"), purpose="batch",
                                                     extra_headers={"Idempotency-Key": "file-key"}))
    assert other.status_code == 409
    (file_id,) = file_ids

    def create_once(_):
        return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                     extra_headers={"Idempotency-Key": "batch-key"}).id

    with cf.ThreadPoolExecutor(6) as pool:
        batch_ids = set(pool.map(create_once, range(6)))
    assert len(batch_ids) == 1 and [b.id for b in client.batches.list()] == list(batch_ids)
    (batch_id,) = batch_ids
    assert counts(wait_final(client, batch_id)) == (1, 1, 0)


# ---- result files: an ended batch's output and error files can be deleted ----------------------------------------

def test_an_ended_batchs_output_and_error_files_can_be_deleted_and_the_batch_keeps_their_ids(client, stack):
    batch = wait_final(client, create(client, [line("ok"), line("bad", max_tokens=0)]).id)
    assert batch.status == "completed" and batch.output_file_id and batch.error_file_id
    for file_id in (batch.output_file_id, batch.error_file_id):
        assert client.files.delete(file_id).deleted
        gone = status_error(lambda: client.files.content(file_id))  # noqa: B023
        assert gone.status_code == 404 and "deleted" in gone.body["message"]
        gone = status_error(lambda: client.files.retrieve(file_id))  # noqa: B023
        assert gone.status_code == 404
    kept = client.batches.retrieve(batch.id)
    assert (kept.output_file_id, kept.error_file_id, counts(kept)) == (batch.output_file_id, batch.error_file_id, (2, 1, 1))
    merged = httpx.get(f"{stack.url}/v1/files/{batch.output_file_id}/content", params={"merged": "true"},
                       headers={"Authorization": f"Bearer {client.api_key}"})
    assert merged.status_code == 404  # ours (docs/endpoints.md): the merged file reads through the output file's id
