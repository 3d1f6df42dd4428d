"""The API against clients that do not play fair (issue 19): a real `batchinfer serve` process on PostgreSQL,
Redis and S3. No worker is needed: every case here is refused or queued by the server itself, so estimates
stay in flight until the server stops waiting (BATCHINFER_API_ESTIMATE_WAIT_S)."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import select
import socket
import time
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from cli_helpers import batchinfer, cli_env, wait_healthy
from jobfiles import chat_line
from benchmarks.support.services import free_port, start_cli, stop

MAX_FILE_BYTES = 2_000_000  # over Starlette's 1 MB in-memory spool: an upload reaches the disk
REQUESTS_PER_MIN = 30
CONCURRENT_ESTIMATES = 2
AUTH_FAILURES_PER_MIN = 20
METRICS_TOKEN = "metrics-" + uuid.uuid4().hex
RSS_LIMIT = 300 * 1024 * 1024
SECURITY = {"content-security-policy": "default-src 'self'", "x-frame-options": "DENY",
            "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_cache, postgres_server, redis_server, s3_server, s3_bucket):
    """(base URL, CLI env, the server process)."""
    import psycopg

    root = tmp_path_factory.mktemp("hostile")
    db = f"batchinfer_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    db_url = postgres_server.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{db}"
    port = free_port()
    env = cli_env(root, model_cache, BATCHINFER_DATABASE_URL=db_url,
                  BATCHINFER_STORAGE_URL=f"s3://{s3_bucket}/hostile-{uuid.uuid4().hex[:8]}",
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_MAX_FILE_BYTES=str(MAX_FILE_BYTES), BATCHINFER_API_REQUESTS_PER_MIN=str(REQUESTS_PER_MIN),
                  BATCHINFER_API_CONCURRENT_ESTIMATES=str(CONCURRENT_ESTIMATES), BATCHINFER_API_ESTIMATE_WAIT_S="3",
                  BATCHINFER_API_AUTH_FAILURES_PER_MIN=str(AUTH_FAILURES_PER_MIN),
                  BATCHINFER_METRICS_TOKEN=METRICS_TOKEN, **s3_server)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    proc = start_cli(env, root / "server.log", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, root / "server.log")
        yield url, env, proc
    finally:
        stop(proc)
        assert "Traceback" not in (root / "server.log").read_text(errors="replace")
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def new_key(server, *flags: str) -> dict[str, str]:
    made = batchinfer(server[1], "keys", "create", "--name", "t", "--json", *flags)
    assert made.returncode == 0, made.stderr
    return {"Authorization": f"Bearer {json.loads(made.stdout)['key']}"}


def upload(server, auth: dict, lines: list[str], filename: str = "in.jsonl") -> httpx.Response:
    """A multipart upload built by hand: the filename goes as it is (httpx would percent-escape controls)."""
    boundary = "b" + uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode() + ("\n".join(lines) + "\n").encode() + \
        f"\r\n--{boundary}--\r\n".encode()
    return httpx.post(f"{server[0]}/v1/files", content=body, timeout=30,
                      headers={**auth, "Content-Type": f"multipart/form-data; boundary={boundary}"})


def rss(proc) -> int:
    with open(f"/proc/{proc.pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def stream_until_answered(url: str, head: str, chunks, on_answer=None) -> tuple[int, int, bytes]:
    """Send `head` then the chunks (already framed) over a raw socket, stopping at the server's first answer:
    (its status, body bytes sent before it, the answer). on_answer() runs as soon as the answer is seen."""
    parts = urlsplit(url)
    sent = 0
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(head.encode())
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        if on_answer is not None:
            on_answer()
        sock.settimeout(30)
        answer = b""
        while not _whole(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return int(answer.split()[1]), sent, answer


def _whole(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                   if line.startswith(b"content-length:")), 0)
    return bool(found) and len(body) >= length


def chunked(pieces):
    for piece in pieces:
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"


def test_an_unauthenticated_gigabyte_is_refused_before_it_is_read(server):  # finding 1
    url, _, proc = server
    head = ("POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = b"[" * (1 << 20)
    status, sent, answer = stream_until_answered(url, head, chunked(piece for _ in range(1024)))  # 1 GiB
    assert status == 401
    assert sent < 1024 * (1 << 20)  # answered long before the gigabyte was through
    assert rss(proc) < RSS_LIMIT
    declared = ("POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {1 << 30}\r\n\r\n")  # a declared gigabyte is refused from its header
    status, sent, _ = stream_until_answered(url, declared, (piece for _ in range(1024)))
    assert status == 413 and rss(proc) < RSS_LIMIT


def test_a_keyed_json_body_over_64_kib_is_cut_off(server):
    auth = new_key(server)
    head = ("POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: {auth['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n")
    status, sent, answer = stream_until_answered(server[0], head, chunked(b" " * 65536 for _ in range(200)))
    assert status == 413 and b"request_too_large" in answer and sent < 200 * 65536


def test_a_chunked_upload_over_the_limit_is_refused_with_nothing_over_the_limit_kept(server):  # finding 5
    url, _, proc = server
    auth = new_key(server)
    boundary = "b" + uuid.uuid4().hex
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode()
    line = (chat_line("x", "y" * 1000) + "\n").encode()
    head = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {auth['Authorization']}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\r\n")
    total = 200 * 1024 * 1024
    open_files: list[int] = []

    def files_held() -> None:  # the server's open regular files (its spool is an unnamed temporary file)
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            try:
                st = os.stat(f"/proc/{proc.pid}/fd/{fd}")
            except OSError:
                continue
            if st.st_mode & 0o170000 == 0o100000:
                open_files.append(st.st_size)

    status, sent, answer = stream_until_answered(
        url, head, chunked([part] + [line * 64] * (total // (len(line) * 64))), on_answer=files_held)
    assert status == 413 and b"file_too_large" in answer
    assert sent < total  # refused as the bytes came, not after them
    assert all(size <= MAX_FILE_BYTES + 16 * 1024 for size in open_files)
    listed = httpx.get(f"{url}/v1/files", headers=auth).json()
    assert listed["data"] == []  # nothing stored
    assert rss(proc) < RSS_LIMIT


def test_hostile_and_unbounded_completion_windows_are_refused(server):  # findings 4 and 13
    auth = new_key(server)
    file_id = upload(server, auth, [chat_line("a", "Hi", max_tokens=1)]).json()["id"]
    for window in ("1" + " " * 30_000 + "!", "99999999999999999999d", "31d", "1e9s"):
        answer = httpx.post(f"{server[0]}/v1/batches", headers=auth, timeout=30,
                            json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                  "completion_window": window})
        assert answer.status_code == 400, window[:40]
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_value", "completion_window")
        assert len(error["message"]) < 200  # a short excerpt
    assert httpx.get(f"{server[0]}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("hook", ["http://127.0.0.1:9/x", "http://0x7f000001:9/hex", "http://[::1]:9/",
                                  "http://169.254.169.254/latest/meta-data", "http://localhost:9/",
                                  "http://2130706433/", "http://example.com/a b", "http://example.com/\nX-Injected: 1"])
def test_webhook_urls_inside_or_malformed_are_refused_at_creation(server, hook):  # findings 7, 9, 12
    auth = new_key(server)
    file_id = upload(server, auth, [chat_line("a", "Hi", max_tokens=1)]).json()["id"]
    answer = httpx.post(f"{server[0]}/v1/batches", headers=auth, timeout=30,
                        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                              "completion_window": "24h", "metadata": {"webhook_url": hook}})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400 and ("webhook" in message or "control characters" in message)
    assert httpx.get(f"{server[0]}/v1/batches", headers=auth).json()["data"] == []


def test_metrics_are_for_operators_and_labels_come_from_a_closed_set(server):  # finding 2
    url = server[0]
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/metrics", headers=new_key(server)).status_code == 403
    for n in range(20):
        httpx.request(f"M{n:04d}", f"{url}/v1/made-up-{n}")
    admin = httpx.get(f"{url}/metrics", headers=new_key(server, "--admin"))
    assert admin.status_code == 200
    token = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert token.status_code == 200 and "batchinfer_batches" in token.text
    assert "M0001" not in token.text and "made-up" not in token.text
    assert 'method="other",route="other",status="401"' in token.text


def test_every_answer_carries_the_security_headers_and_docs_are_off(server):  # finding 3
    url = server[0]
    answers = [httpx.get(f"{url}/health"), httpx.get(f"{url}/"), httpx.get(f"{url}/v1/models"),
               httpx.get(f"{url}/v1/models", headers=new_key(server))]
    for answer in answers:
        assert {k: answer.headers.get(k) for k in SECURITY} == SECURITY, answer.url
    assert [a.status_code for a in answers] == [200, 200, 401, 200]
    assert httpx.get(f"{url}/docs").status_code == 404 and httpx.get(f"{url}/openapi.json").status_code == 404


@pytest.mark.parametrize("filename", ["a\x00b.jsonl", "gpj.\u202ejsonl", "two\nlines.jsonl"])
def test_filenames_with_control_characters_are_refused(server, filename):  # finding 11
    auth = new_key(server)
    answer = upload(server, auth, [chat_line("a", "Hi")], filename=filename)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_value"
    assert answer.json()["error"]["param"] == "file"
    assert httpx.get(f"{server[0]}/v1/files", headers=auth).json()["data"] == []


def test_ids_and_cursors_with_nul_are_refused_before_postgresql(server):
    auth = new_key(server)
    for path in ("/v1/batches/batch_%00", "/v1/files/file-%00x", "/v1/files?after=%00", "/v1/batches?after=a%00"):
        answer = httpx.get(server[0] + path, headers=auth)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_url", path


def test_metadata_with_control_characters_is_refused(server):
    auth = new_key(server)
    file_id = upload(server, auth, [chat_line("a", "Hi", max_tokens=1)]).json()["id"]
    answer = httpx.post(f"{server[0]}/v1/batches", headers=auth, timeout=30,
                        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                              "completion_window": "24h", "metadata": {"team": "a\u202eb"}})
    assert answer.status_code == 400 and "control characters" in answer.json()["error"]["message"]


def test_a_flood_from_one_key_gets_429_with_retry_after_and_others_are_served(server):  # finding 6
    flooder, other = new_key(server), new_key(server)
    with cf.ThreadPoolExecutor(8) as pool:  # 4 times the bucket: more than a slow machine refills meanwhile
        answers = list(pool.map(lambda _: httpx.get(f"{server[0]}/v1/models", headers=flooder, timeout=30),
                                range(4 * REQUESTS_PER_MIN)))
    limited = [a for a in answers if a.status_code == 429]
    assert limited and all(int(a.headers["retry-after"]) >= 1 for a in limited)
    assert limited[0].json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(f"{server[0]}/v1/models", headers=other).status_code == 200


def test_estimates_of_one_key_in_flight_are_bounded(server):
    auth = new_key(server)
    file_id = upload(server, auth, [chat_line("a", "Hi", max_tokens=1)]).json()["id"]

    def estimate(_: int) -> httpx.Response:
        return httpx.post(f"{server[0]}/v1/batches/estimate", headers=auth, json={"input_file_id": file_id},
                          timeout=60)

    with cf.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(estimate, range(6)))
    refused = [a for a in answers if a.status_code == 429]
    assert len(answers) - len(refused) <= CONCURRENT_ESTIMATES  # the rest waited on a worker (none here): 503
    assert refused and all(a.headers["retry-after"] for a in refused)
    assert {a.json()["error"]["code"] for a in refused} == {"too_many_estimates"}


def test_two_servers_share_a_keys_rate_and_estimates_in_flight(server, tmp_path):
    """Behind a balancer: a second `serve` on the same Redis holds the key to the same budget (in-process
    limits would let each server pass the whole of it)."""
    url, env, _ = server
    port = free_port()
    second = start_cli(env, tmp_path / "second.log", "serve", "--port", str(port))
    try:
        wait_healthy(second, f"http://127.0.0.1:{port}", tmp_path / "second.log")
        urls = [url, f"http://127.0.0.1:{port}"]
        auth = new_key(server)
        started = time.time()
        answers = [httpx.get(f"{urls[n % 2]}/v1/models", headers=auth, timeout=30) for n in range(2 * REQUESTS_PER_MIN)]
        refilled = (time.time() - started) * REQUESTS_PER_MIN / 60
        passed = sum(a.status_code == 200 for a in answers)
        assert passed <= REQUESTS_PER_MIN + refilled + 1, (passed, refilled)
        assert {a.status_code for a in answers} == {200, 429}
        estimator = new_key(server)
        file_id = upload(server, estimator, [chat_line("a", "Hi", max_tokens=1)]).json()["id"]
        with cf.ThreadPoolExecutor(6) as pool:
            estimates = list(pool.map(lambda n: httpx.post(f"{urls[n % 2]}/v1/batches/estimate", headers=estimator,
                                                           json={"input_file_id": file_id}, timeout=60), range(6)))
        assert sum(a.status_code != 429 for a in estimates) <= CONCURRENT_ESTIMATES  # between both servers
    finally:
        stop(second)
        assert "Traceback" not in (tmp_path / "second.log").read_text(errors="replace")


def test_failed_authentications_are_throttled_per_address(server):  # finding 6; last: it spends this address's budget
    def guess(_: int) -> httpx.Response:
        return httpx.get(f"{server[0]}/v1/batches", headers={"Authorization": "Bearer sk-bi-guess"}, timeout=30)

    with cf.ThreadPoolExecutor(8) as pool:  # 3 times the bucket: more than a slow machine refills meanwhile
        answers = list(pool.map(guess, range(3 * AUTH_FAILURES_PER_MIN)))
    throttled = [a for a in answers if a.status_code == 429]
    assert {a.status_code for a in answers} == {401, 429}
    assert all(int(a.headers["retry-after"]) >= 1 for a in throttled)
    assert {a.json()["error"]["code"] for a in throttled} == {"too_many_auth_failures"}


def test_an_estimate_of_a_file_deleted_while_it_waited_names_no_server_path(make_context):  # finding 10
    """The worker's side of POST /v1/batches/estimate (store_estimate), on local storage: the API answers
    with the stored error as it is."""
    import io

    from batchinfer.jobs import files
    from batchinfer.runtime.preview import estimate_key, store_estimate

    ctx = make_context()
    view = files.upload(ctx, "owner", io.BytesIO((chat_line("a", "Hi") + "\n").encode()), "in.jsonl")
    files.delete(ctx, "owner", view.id)
    store_estimate(ctx, "e1", view.storage_key, [])
    with ctx.storage.open_read(estimate_key("e1")) as stream:
        error = json.loads(stream.read())["error"]
    assert "gone" in error and "/" not in error and "Error" not in error and str(ctx.settings.data_dir) not in error
