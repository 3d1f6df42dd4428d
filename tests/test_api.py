"""The HTTP API end to end: a real `batchinfer serve` process and a real worker on PostgreSQL, Redis and S3,
driven by the official `openai` SDK (and by the CLI as a thin client)."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
import uuid

import httpx
import openai
import pytest

from cli_helpers import batchinfer, cli_env, wait_healthy
from jobfiles import chat_line, completion_line
from benchmarks.support.services import free_port, start_cli, stop

MAX_FILE_BYTES = 300_000
ACTIVE_LIMIT = 3
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def api(tmp_path_factory, model_cache, postgres_server, redis_server, s3_server, s3_bucket):
    """One server and one worker for the module: (base URL, env for the CLI on the server's machine)."""
    import psycopg

    root = tmp_path_factory.mktemp("api")
    db = f"batchinfer_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    db_url = postgres_server.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{db}"
    port = free_port()
    env = cli_env(root, model_cache, BATCHINFER_DATABASE_URL=db_url,
                  BATCHINFER_STORAGE_URL=f"s3://{s3_bucket}/api-{uuid.uuid4().hex[:8]}",
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.3", BATCHINFER_MAX_REQUESTS_PER_UNIT="2",
                  BATCHINFER_MAX_FILE_BYTES=str(MAX_FILE_BYTES),
                  BATCHINFER_MAX_ACTIVE_BATCHES_PER_OWNER=str(ACTIVE_LIMIT), **s3_server)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    worker = start_cli(env, root / "worker.log", "worker", "--name", f"w{uuid.uuid4().hex[:6]}")
    server = start_cli(env, root / "server.log", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, root / "server.log")
        yield url, env, root
    finally:
        stop(server)
        stop(worker)
        for log in ("server.log", "worker.log"):
            assert "Traceback" not in (root / log).read_text(errors="replace"), f"traceback in {log}"
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def new_key(api, name: str = "tenant") -> str:
    made = batchinfer(api[1], "keys", "create", "--name", name, "--json")
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)["key"]


def client(api, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api[0]}/v1", api_key=key, max_retries=0)


def jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def wait_final(c: openai.OpenAI, batch_id: str, timeout: float = 240):
    deadline = time.time() + timeout
    while True:
        batch = c.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        assert time.time() < deadline, f"batch {batch_id} still {batch.status}"
        time.sleep(0.3)


def lines_of(c: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [json.loads(line) for line in c.files.content(file_id).text.splitlines()] if file_id else []


def test_upload_create_poll_content_and_metrics(api):
    c = client(api, new_key(api))
    assert [m.id for m in c.models.list()] == ["smollm2-135m-instruct"]
    uploaded = c.files.create(file=("in.jsonl", jsonl([chat_line("a", "Hi!"), completion_line("b", "One, two,")])),
                              purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0 and c.files.retrieve(uploaded.id).id == uploaded.id
    created = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                               metadata={"team": "search"})
    assert created.status == "validating" and created.input_file_id == uploaded.id
    batch = wait_final(c, created.id)
    assert batch.status == "completed" and batch.metadata == {"team": "search"}
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (2, 2, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    out = lines_of(c, batch.output_file_id)
    assert [o["custom_id"] for o in out] == ["a", "b"]
    assert batch.usage.input_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out) > 0
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens
    assert c.files.retrieve(batch.output_file_id).bytes == len(c.files.content(batch.output_file_id).content)
    assert all(o["metrics"]["ttft_s"] >= 0 for o in out)
    groups = httpx.get(f"{api[0]}/v1/batches/{batch.id}/prefix_groups", headers={"Authorization": f"Bearer {c.api_key}"})
    assert sum(g["requests"] for g in groups.json()["data"]) == 2
    assert httpx.get(f"{api[0]}/metrics").status_code == 401  # operators only
    admin = json.loads(batchinfer(api[1], "keys", "create", "--name", "ops", "--admin", "--json").stdout)["key"]
    metrics = httpx.get(f"{api[0]}/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    assert 'batchinfer_batches{status="completed"}' in metrics and "batchinfer_http_request_duration_seconds" in metrics
    assert 'batchinfer_tokens{kind="prompt"}' in metrics and "batchinfer_queue_depth" in metrics


def test_cancel_keeps_finished_results(api):
    c = client(api, new_key(api))
    ids = [f"r{i}" for i in range(10)]
    uploaded = c.files.create(file=("in.jsonl", jsonl([chat_line(i, f"Count to {n + 5}.", max_tokens=24)
                                                       for n, i in enumerate(ids)])), purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.time() + 240
    while c.batches.retrieve(batch.id).request_counts.completed == 0:  # units of 2: some finish before the rest
        assert time.time() < deadline
        time.sleep(0.1)
    assert c.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    final = wait_final(c, batch.id)
    assert final.status == "cancelled" and final.cancelled_at
    done, errors = lines_of(c, final.output_file_id), lines_of(c, final.error_file_id)
    assert 0 < len(done) < 10 and sorted(o["custom_id"] for o in done + errors) == sorted(ids)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert final.request_counts.completed == len(done)


def test_pause_and_resume_over_http(api):
    c, other = client(api, new_key(api)), client(api, new_key(api, "other"))
    ids = [f"p{i}" for i in range(12)]
    uploaded = c.files.create(file=("in.jsonl", jsonl([chat_line(i, f"Count to {n + 5}.", max_tokens=24)
                                                       for n, i in enumerate(ids)])), purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    while c.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.1)
    paused = c.post(f"/batches/{batch.id}/pause", cast_to=openai.types.Batch)
    assert paused.status == "paused" and c.batches.retrieve(batch.id).status == "paused"
    with pytest.raises(openai.NotFoundError):  # another tenant's batch
        other.post(f"/batches/{batch.id}/resume", cast_to=openai.types.Batch)
    resumed = c.post(f"/batches/{batch.id}/resume", cast_to=openai.types.Batch)
    assert resumed.status in ("queued", "in_progress", "finalizing", "completed")
    final = wait_final(c, batch.id)
    assert final.status == "completed" and sorted(o["custom_id"] for o in lines_of(c, final.output_file_id)) == sorted(ids)
    with pytest.raises(openai.ConflictError, match="Cannot pause a batch with status 'completed'"):
        c.post(f"/batches/{batch.id}/pause", cast_to=openai.types.Batch)


def test_a_bad_file_fails_with_errors_naming_each_line(api):
    c = client(api, new_key(api))
    bad = jsonl([chat_line("ok", "Hi"), "{not json", json.dumps({"custom_id": "x", "method": "POST",
                                                                  "url": "/v1/moderations", "body": {}})])
    batch = c.batches.create(input_file_id=c.files.create(file=("bad.jsonl", bad), purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    final = wait_final(c, batch.id)
    assert final.status == "failed" and final.failed_at
    assert [(e.line, e.code) for e in final.errors.data] == [(2, "invalid_json_line"), (3, "invalid_url")]
    assert all(e.message for e in final.errors.data) and final.output_file_id is None
    errors = lines_of(c, final.error_file_id)  # its bad lines are its error file
    assert [(e["custom_id"], e["error"]["line"], e["error"]["code"]) for e in errors] == [
        (None, 2, "invalid_json_line"), ("x", 3, "invalid_url")]


def test_pagination_of_files_and_batches(api):
    c = client(api, new_key(api))
    files = [c.files.create(file=(f"f{i}.jsonl", jsonl(["{bad"])), purpose="batch") for i in range(5)]
    page = c.files.list(limit=2)
    assert [f.id for f in page.data] == [f.id for f in reversed(files)][:2] and page.has_more
    assert [f.id for f in c.files.list(limit=2, after=page.data[-1].id).data] == [f.id for f in reversed(files)][2:4]
    assert [f.id for f in c.files.list()] == [f.id for f in reversed(files)]  # the SDK follows the cursor
    assert [f.id for f in c.files.list(order="asc", limit=100).data] == [f.id for f in files]
    batches = [c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
               for f in files[:3]]
    first = c.batches.list(limit=2)
    assert [b.id for b in first.data] == batches[::-1][:2] and first.has_more
    rest = c.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == batches[:1] and not rest.has_more
    assert sorted(b.id for b in c.batches.list()) == sorted(batches)


def test_another_tenants_ids_answer_404_and_lists_never_show_them(api):
    alice, bob = client(api, new_key(api, "alice")), client(api, new_key(api, "bob"))
    uploaded = alice.files.create(file=("a.jsonl", jsonl([chat_line("a", "Hi", max_tokens=1)])), purpose="batch")
    batch = wait_final(alice, alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                   completion_window="24h").id)
    assert batch.status == "completed"
    calls = [lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
             lambda: bob.files.delete(uploaded.id), lambda: bob.files.retrieve(batch.output_file_id),
             lambda: bob.files.content(batch.output_file_id), lambda: bob.batches.retrieve(batch.id),
             lambda: bob.batches.cancel(batch.id)]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    # a batch of someone else's file is OpenAI's unknown file: made, and failed naming file_id, as for an id never used
    for file_id in (uploaded.id, "file-" + "0" * 32):
        made = wait_final(bob, bob.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id)
        (error,) = made.errors.data
        assert (made.status, error.code, error.param) == ("failed", "invalid_request", "file_id")
        assert error.message == f"Cannot find file '{file_id}', or this API key does not have access to it."
    with pytest.raises(openai.NotFoundError) as not_mine:
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError) as missing:
        bob.batches.retrieve("batch_" + "0" * 32)
    same = {k: v.replace(batch.id, "ID").replace("batch_" + "0" * 32, "ID") if isinstance(v, str) else v
            for k, v in not_mine.value.body.items()}
    assert same == {k: v.replace("batch_" + "0" * 32, "ID") if isinstance(v, str) else v
                    for k, v in missing.value.body.items()}  # someone else's id reads exactly as a missing one
    assert uploaded.id not in [f.id for f in bob.files.list()] and batch.id not in [b.id for b in bob.batches.list()]
    headers = {"Authorization": f"Bearer {bob.api_key}"}
    assert httpx.get(f"{api[0]}/v1/batches/{batch.id}/prefix_groups", headers=headers).status_code == 404
    assert alice.files.retrieve(uploaded.id).id == uploaded.id  # still there for its owner


def test_a_bad_or_revoked_key_gets_401_and_an_oversized_upload_413(api):
    with pytest.raises(openai.AuthenticationError) as bad:
        client(api, "sk-bi-wrong").batches.list()
    assert bad.value.body["type"] == "authentication_error"
    assert httpx.get(f"{api[0]}/v1/files").status_code == 401
    made = json.loads(batchinfer(api[1], "keys", "create", "--name", "gone", "--json").stdout)
    assert client(api, made["key"]).batches.list().data == []
    assert batchinfer(api[1], "keys", "revoke", made["id"]).returncode == 0
    with pytest.raises(openai.AuthenticationError):
        client(api, made["key"]).batches.list()
    listed = json.loads(batchinfer(api[1], "keys", "list", "--json").stdout)
    assert any(k["id"] == made["id"] and k["revoked_at"] for k in listed) and "key" not in listed[0]
    c = client(api, new_key(api))
    big = (chat_line("x", "y" * 1000) + "\n").encode() * (MAX_FILE_BYTES // 1000 + 10)
    with pytest.raises(openai.APIStatusError) as too_big:
        c.files.create(file=("big.jsonl", big), purpose="batch")
    assert too_big.value.status_code == 413 and too_big.value.body["code"] == "file_too_large"
    assert c.files.list().data == []


def test_too_many_active_batches_answer_429(api):
    c = client(api, new_key(api))
    file_id = c.files.create(file=("in.jsonl", jsonl([chat_line(f"q{i}", "Tell a story.", max_tokens=16)
                                                      for i in range(4)])), purpose="batch").id
    made = [c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
            for _ in range(ACTIVE_LIMIT)]
    with pytest.raises(openai.RateLimitError):
        c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for batch in made:
        c.batches.cancel(batch.id)
        wait_final(c, batch.id)


def test_twenty_batches_from_several_keys_at_once_all_complete_nothing_lost_or_duplicated(api):
    keys = [new_key(api, f"k{i}") for i in range(7)]

    def one(n: int):  # about 3 uploads a key at once, over its limit of 2: the SDK retries 429 after Retry-After
        c = openai.OpenAI(base_url=f"{api[0]}/v1", api_key=keys[n % len(keys)], max_retries=8)
        ids = [f"b{n}-{i}" for i in range(2)]
        up = c.files.create(file=(f"{n}.jsonl", jsonl([completion_line(i, f"Item {i}:", max_tokens=1) for i in ids])),
                            purpose="batch")
        return c, ids, c.batches.create(input_file_id=up.id, endpoint="/v1/completions", completion_window="24h").id

    with cf.ThreadPoolExecutor(20) as pool:
        made = list(pool.map(one, range(20)))
    for c, ids, batch_id in made:
        final = wait_final(c, batch_id, timeout=600)
        assert final.status == "completed", final
        assert sorted(o["custom_id"] for o in lines_of(c, final.output_file_id)) == sorted(ids)
        assert final.request_counts.completed == 2


def test_the_cli_is_a_thin_client_with_only_the_api_url_and_key(api, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCHINFER_", "AWS_"))}
    env.update({"BATCHINFER_API_URL": api[0], "BATCHINFER_API_KEY": new_key(api), "COLUMNS": "200",
                "BATCHINFER_DATA_DIR": str(tmp_path / "nothing-here"), "BATCHINFER_MODEL_CACHE": str(tmp_path / "no-model")})
    src = tmp_path / "in.jsonl"
    src.write_text(chat_line("one", "Hi", max_tokens=2) + "\n" + chat_line("two", "Yo", max_tokens=2) + "\n")
    submitted = batchinfer(env, "submit", str(src), "--json", "--metadata", "via=cli")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = json.loads(submitted.stdout)["id"]
    status = batchinfer(env, "status", batch_id, "--watch", "--json")
    final = json.loads(status.stdout)
    assert final["status"] == "completed" and final["metadata"] == {"via": "cli"}
    assert final == {**client(api, env["BATCHINFER_API_KEY"]).batches.retrieve(batch_id).model_dump(),
                     "prefix_groups": final["prefix_groups"]}
    assert batch_id in batchinfer(env, "list").stdout
    out = tmp_path / "out.jsonl"
    assert batchinfer(env, "download", batch_id, "-o", str(out)).returncode == 0
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    rejected = batchinfer(env, "submit", str(bad))
    assert rejected.returncode == 2 and "line 1: invalid_json_line" in rejected.stderr
    assert "Traceback" not in rejected.stderr
    gone = batchinfer(env, "status", "batch_" + "0" * 32)
    assert gone.returncode == 3 and gone.stderr.startswith("error:")
    assert not (tmp_path / "nothing-here").exists()  # no local database or files were made
