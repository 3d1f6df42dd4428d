"""Live counts with real processes: a 200-request job in one unit on one worker; `status --watch` (into a
file, not a terminal) and the API's request_counts both see the completed count rise many times before the
job ends, and settle on the committed figures. `serve` prints its address; an admin key reads CLI jobs."""
import json
import re
import time
import uuid

import httpx
import pytest

from batchinfer.settings import Settings
from cli_helpers import batchinfer, cli_env, wait_for
from jobfiles import chat_line
from benchmarks.support.services import start_cli, stop
from batchinfer.cluster.registry import open_registry

N = 200



def _wait(condition, what: str, timeout: float = 240.0, every: float = 0.2):
    return wait_for(condition, what, timeout, every)


@pytest.fixture
def stack(tmp_path, model_cache, postgres_url, s3_url, redis_server, s3_server):
    """One worker (a single unit of up to 200 requests) and an API server on a port it picks itself."""
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url, BATCHINFER_STORAGE_URL=s3_url,
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.5", BATCHINFER_MAX_REQUESTS_PER_UNIT=str(N),
                  BATCHINFER_PROGRESS_FLUSH_S="0.25", **s3_server)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    name = f"w{uuid.uuid4().hex[:6]}"
    worker = start_cli(env, tmp_path / "worker.log", "worker", "--name", name)
    server = start_cli(env, tmp_path / "server.log", "serve", "--port", "0")
    settings = Settings(broker_url=env["BATCHINFER_BROKER_URL"], broker_prefix=env["BATCHINFER_BROKER_PREFIX"])
    try:
        printed = _wait(lambda: re.search(r"listening on (http://\S+)", (tmp_path / "server.log").read_text())
                        or server.poll() is not None, "the server's address", 120)
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        _wait(lambda: name in {w.name for w in open_registry(settings).live()} or worker.poll() is not None, "the worker")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        yield env, printed.group(1)
    finally:
        stop(server)
        stop(worker)


def test_counts_rise_in_status_and_the_api_while_one_unit_runs(stack, tmp_path):
    env, base = stack
    admin = json.loads(batchinfer(env, "keys", "create", "--name", "ops", "--admin", "--json").stdout)["key"]
    tenant = json.loads(batchinfer(env, "keys", "create", "--name", "t", "--json").stdout)["key"]
    src = tmp_path / "in.jsonl"
    # max_tokens 3 to 60 in 20 steps on prompts that run long: requests of the one unit finish at 20 points over
    # about 60 engine steps, so the watch's polls (0.5 s) see the count rise many times even on a fast CPU (a Zen 5
    # ran the former 1 to 8 in under a second: the watch saw 4 rises); about 5 s there
    src.write_text("\n".join(chat_line(f"r{i}", f"Write a long story about the number {i}.", max_tokens=3 + (i % 20) * 3)
                             for i in range(N)) + "\n")
    submitted = batchinfer(env, "submit", str(src))  # no API key: a CLI job, which only an admin key reads
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    watch_log = tmp_path / "watch.log"
    watcher = start_cli(env, watch_log, "status", job_id, "--watch")  # stdout is a file: a line per change

    seen_api = []
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=10) as api:
            assert httpx.get(f"{base}/v1/batches/{job_id}", headers={"Authorization": f"Bearer {tenant}"}).status_code == 404
            assert job_id in [b["id"] for b in api.get("/v1/batches", params={"all": "true"}).json()["data"]]
            while True:
                batch = api.get(f"/v1/batches/{job_id}").json()
                if not seen_api or batch["request_counts"]["completed"] != seen_api[-1]["request_counts"]["completed"]:
                    seen_api.append(batch)
                if batch["status"] in ("completed", "failed", "cancelled", "expired"):
                    seen_api.append(batch)
                    break
                assert len(seen_api) < 10_000
                time.sleep(0.2)
        watcher.wait(60)
    finally:
        stop(watcher)
    final = seen_api[-1]
    assert final["status"] == "completed" and final["request_counts"] == {"total": N, "completed": N, "failed": 0}
    running = [b["request_counts"]["completed"] for b in seen_api if b["status"] == "in_progress"]
    rises = sum(1 for a, b in zip(running, running[1:]) if b > a)
    print(f"completed counts seen through the API while in progress: {running}")
    # moved inside the unit, not only at its commit: some count strictly between. The last one read while in progress
    # may be N: the live rows count every request before the unit stores its results and commits
    assert rises >= 5 and any(0 < c < N for c in running), running
    assert all(b >= a for a, b in zip(running, running[1:])), running  # never counted twice, never back
    assert final["usage"]["output_tokens"] >= max(b["usage"]["output_tokens"] for b in seen_api)

    lines = watch_log.read_text().splitlines()
    counts = [int(m.group(1)) for m in (re.search(r"in_progress: (\d+) completed", line) for line in lines) if m]
    assert sum(1 for a, b in zip(counts, counts[1:]) if b > a) >= 5, lines
    assert re.search(rf"{job_id} completed: {N} completed, 0 failed", lines[-1]), lines[-1]

    tenant_auth, admin_auth = ({"Authorization": f"Bearer {k}"} for k in (tenant, admin))
    assert httpx.get(f"{base}/v1/batches", params={"all": "true"}, headers=tenant_auth).status_code == 403
    assert httpx.post(f"{base}/v1/batches/{job_id}/cancel", headers=tenant_auth).status_code == 404
    assert httpx.post(f"{base}/v1/batches/{job_id}/cancel", headers=admin_auth).status_code == 409  # found: it ended

    server_log = (tmp_path / "server.log").read_text()
    assert re.search(r"GET /v1/batches/\{batch_id\} 200 [\d.]+ ms key=key_", server_log), server_log[-2000:]
    assert admin not in server_log and tenant not in server_log  # key ids only, never a secret
    metrics = httpx.get(f"{base}/metrics", headers=admin_auth).text  # operators only
    assert re.search(rf'batchinfer_requests\{{outcome="completed"\}} {N}(\.0)?\b', metrics)
