"""An Anthropic Message Batches create is bounded like an upload (docs/limits.md): its body is cut off past
max_message_batch_bytes (413 before it is parsed), it holds one of its key's upload places while it is read (the
next past the cap gets 429), and parsing costs a bounded multiple of its size. A `batchinfer serve` app on the
embedded setup (SQLite, local files), served by uvicorn in this process."""
from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc

import httpx
import pytest
import uvicorn

from batchinfer.jobs.endpoints.anthropic import input_lines, parse_create

pytestmark = pytest.mark.fast


@pytest.fixture
def served(make_settings):
    """(base url, a key's secret) of an app limited to 1 upload in flight a key and 256 KiB a Message Batch."""
    from batchinfer.api.app import create_app
    from batchinfer.jobs.tenancy import tenants

    settings = make_settings(api_concurrent_uploads=1, max_message_batch_bytes=256 * 1024, access_log=False)
    app = create_app(settings)
    _, secret = tenants.create_key(app.state.ctx, "tenant")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", secret
    server.should_exit = True
    thread.join(10)


def _body(count: int, text: str = "hello", max_tokens: int = 0) -> bytes:
    """max_tokens 0: each request is refused at validation, so the batch ends without the engine (the tiny model
    has no weights)."""
    return json.dumps({"requests": [{"custom_id": f"r{i}", "params": {
        "model": "smollm2-135m-instruct", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}}
        for i in range(count)]}).encode()


def test_a_body_past_the_limit_is_refused_before_it_is_parsed(served):
    url, secret = served
    answer = httpx.post(f"{url}/v1/messages/batches", content=_body(3000), headers={"x-api-key": secret}, timeout=30)
    assert answer.status_code == 413 and "262144-byte limit" in answer.text
    ok = httpx.post(f"{url}/v1/messages/batches", content=_body(2), headers={"x-api-key": secret}, timeout=30)
    assert ok.status_code == 200 and ok.json()["type"] == "message_batch", ok.text


def test_a_create_in_flight_holds_its_keys_upload_place(served):
    url, secret = served
    body = _body(50)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as slow:  # sends its head and half its body, then waits
        slow.sendall(f"POST /v1/messages/batches HTTP/1.1\r\nHost: x\r\nx-api-key: {secret}\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode())
        slow.sendall(body[:len(body) // 2])
        time.sleep(0.5)
        second = httpx.post(f"{url}/v1/messages/batches", content=body, headers={"x-api-key": secret}, timeout=30)
        assert second.status_code == 429 and "too_many_uploads" in second.text
        slow.sendall(body[len(body) // 2:])
        slow.settimeout(30)
        assert slow.recv(64).split()[1] == b"200"
    third = httpx.post(f"{url}/v1/messages/batches", content=body, headers={"x-api-key": secret}, timeout=30)
    assert third.status_code == 200, third.text  # the place was given back


def test_parsing_a_create_costs_a_bounded_multiple_of_its_size():
    raw = _body(20_000, "hello there " * 20, max_tokens=8)  # 7 MB
    tracemalloc.start()
    try:
        lines = input_lines(parse_create(raw, 100_000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines.count(b"\n") == 20_000
    assert peak < 10 * len(raw), peak / len(raw)  # measured 7.1x: at the 32 MiB default, ~230 MB a create
