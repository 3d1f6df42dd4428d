"""A fair share of validation and estimate work between keys (issue 19, finding 6): a real `batchinfer serve`
process in the embedded mode (SQLite, local files, no broker), where validations and estimates run in the
server itself. One key floods it with large batches and estimates; another key's one-line batch is validated
before the flood has drained, not behind it."""
from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from cli_helpers import cli_env, wait_healthy
from jobfiles import chat_line
from test_api_hostile import upload
from benchmarks.support.services import free_port, start_cli, stop

FLOOD_BATCHES = 4
FLOOD_LINES = 6000  # seconds of validation each: at 1,500 a quiet machine validated 3 of 4 before the other key's batch arrived


@pytest.fixture
def embedded_server(tmp_path, model_cache):
    """(base URL, the flooding key's headers, the other key's)."""
    from batchinfer.context import AppContext
    from batchinfer.jobs.tenancy.tenants import create_key
    from batchinfer.settings import Settings

    ctx = AppContext.create(Settings(data_dir=tmp_path / "data", model_cache=model_cache), migrate=True)
    auths = [{"Authorization": f"Bearer {create_key(ctx, name)[1]}"} for name in ("flooder", "other")]
    port = free_port()
    env = cli_env(tmp_path, model_cache, BATCHINFER_API_ESTIMATE_WAIT_S="5", BATCHINFER_API_WORK_THREADS="2")
    proc = start_cli(env, tmp_path / "server.log", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, tmp_path / "server.log")
        yield url, *auths
    finally:
        stop(proc)
        assert "Traceback" not in (tmp_path / "server.log").read_text(errors="replace")


def create(server, auth: dict, file_id: str) -> dict:
    answer = httpx.post(f"{server[0]}/v1/batches", headers=auth, timeout=30,
                        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def status(server, auth: dict, batch_id: str) -> str:
    return httpx.get(f"{server[0]}/v1/batches/{batch_id}", headers=auth, timeout=30).json()["status"]


def flood_then_one_line(server, flooder: dict, other: dict) -> tuple[str, float, list[str]]:
    """The flooding key creates FLOOD_BATCHES big batches and keeps 2 estimates of them in flight; then the other
    key creates a one-line batch. (its id, seconds it stayed `validating`, the flood's batches still `validating`
    when it left)."""
    # every line valid but the last: validation tokenizes the whole file, then fails the batch (no engine run)
    big = [chat_line(f"a{i}", f"Summarize item {i} of the inventory in one word.", max_tokens=1)
           for i in range(FLOOD_LINES)] + ['{"custom_id": "broken"']
    big_id = upload(server, flooder, big).json()["id"]
    floods = [create(server, flooder, big_id)["id"] for _ in range(FLOOD_BATCHES)]
    stop_estimates = threading.Event()

    def estimates() -> None:  # as many as the key may have in flight, again and again
        while not stop_estimates.is_set():
            try:
                httpx.post(f"{server[0]}/v1/batches/estimate", headers=flooder, json={"input_file_id": big_id},
                           timeout=90)
            except httpx.HTTPError:  # the server stopped under it: the test is over
                return

    estimators = [threading.Thread(target=estimates) for _ in range(2)]
    for thread in estimators:
        thread.start()
    try:
        small_id = upload(server, other, [chat_line("b", "Hi", max_tokens=1)]).json()["id"]
        mine = create(server, other, small_id)["id"]
        started = time.time()
        while status(server, other, mine) == "validating":
            assert time.time() - started < 600, "the one-line batch was never validated"
            time.sleep(0.1)
        waited = time.time() - started
        still_validating = [b for b in floods if status(server, flooder, b) == "validating"]
    finally:
        stop_estimates.set()  # the threads end with their estimate in flight, or when the server stops
    print(f"\none-line batch validated after {waited:.2f} s with {len(still_validating)} of the flood's "
          f"{FLOOD_BATCHES} batches still validating; load average {os.getloadavg()[0]:.1f}")
    return mine, waited, still_validating


def test_one_keys_flood_does_not_hold_back_another_keys_one_line_batch(embedded_server):
    server, flooder, other = embedded_server[:1], *embedded_server[1:]
    mine, waited, still_validating = flood_then_one_line(server, flooder, other)
    # The flood's validations run one at a time (one key, one thread); the other key's went past them.
    assert len(still_validating) >= FLOOD_BATCHES // 2, (still_validating, waited)
    assert status(server, other, mine) in {"queued", "in_progress", "finalizing", "completed"}
    started = time.time()  # and it runs, on the engine's own thread, while the flood is still validated
    while (now := status(server, other, mine)) != "completed":
        assert now in {"queued", "in_progress", "finalizing"} and time.time() - started < 300, now
        time.sleep(0.2)
