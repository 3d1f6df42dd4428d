"""The production path: CLI submit against PostgreSQL + Redis + S3, run by a separate Celery worker process."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from batchinfer.settings import Settings
from benchmarks.process import children
from cli_helpers import batchinfer, cli_env
from jobfiles import chat_line, completion_line
from batchinfer.cluster.registry import open_registry


@pytest.fixture
def cluster_env(tmp_path, model_cache, postgres_url, s3_url, redis_server, s3_server):
    prefix = f"bitest-{uuid.uuid4().hex[:8]}:"
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url, BATCHINFER_STORAGE_URL=s3_url,
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=prefix,
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.5", **s3_server)
    migrate = batchinfer(env, "db", "upgrade")
    assert migrate.returncode == 0, migrate.stderr
    return env


def _start_worker(env, log_path, name: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", "worker", "--name", name], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    settings = Settings(broker_url=env["BATCHINFER_BROKER_URL"], broker_prefix=env["BATCHINFER_BROKER_PREFIX"])
    deadline = time.time() + 180
    while name not in {w.name for w in open_registry(settings).live()}:  # listed once the model is loaded
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.time() < deadline, "worker did not come up"
        time.sleep(0.5)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def worker(cluster_env, tmp_path):
    name = f"w{uuid.uuid4().hex[:6]}"
    proc = _start_worker(cluster_env, tmp_path / "worker.log", name)
    try:
        yield name
    finally:
        _stop(proc)


def test_a_job_submitted_from_the_cli_runs_on_a_worker_and_downloads(cluster_env, worker, tmp_path):
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join([chat_line("first", "Hello!"), completion_line("second", "The capital of Italy is"),
                              chat_line("third", "Name a fruit.")]) + "\n")
    submitted = batchinfer(cluster_env, "submit", str(src), "--json", "--metadata", "run=e2e")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["status"] == "queued" and job["metadata"] == {"run": "e2e"}
    watched = batchinfer(cluster_env, "status", job["id"], "--watch", "--json", timeout=300)
    final = json.loads(watched.stdout)
    assert final["status"] == "completed", final
    assert final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert final["in_progress_at"] and final["finalizing_at"] and final["completed_at"]
    assert final["output_file_id"] == "file-out-" + job["id"].removeprefix("batch_")
    out = tmp_path / "out.jsonl"
    downloaded = batchinfer(cluster_env, "download", job["id"], "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["custom_id"] for o in lines] == ["first", "second", "third"]
    assert {o["metrics"]["worker"] for o in lines} == {worker}
    assert all(o["response"]["body"]["usage"]["completion_tokens"] >= 1 for o in lines)
    assert final["usage"]["input_tokens"] == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in lines)


def _maps_torch(pid: int) -> bool:
    return "libtorch" in open(f"/proc/{pid}/maps").read()


def test_the_worker_generates_in_its_engine_process_and_dies_with_it(cluster_env, tmp_path):
    """The worker forks its engine process first thing (torch loads beside Celery's start): the worker itself
    never maps torch. That process killed (as the out-of-memory killer would) takes the worker down at its
    next unit, exit 70 with one line, and the unit runs again when the worker is back: nothing failed or doubled."""
    name, log = f"w{uuid.uuid4().hex[:6]}", tmp_path / "worker.log"
    proc = _start_worker(cluster_env, log, name)
    try:
        (engine,) = children(proc.pid)
        assert _maps_torch(engine) and not _maps_torch(proc.pid)
        os.kill(engine, signal.SIGKILL)
        src = tmp_path / "batch.jsonl"
        src.write_text("\n".join(chat_line(f"r{i}", f"Name a colour, {i}.", max_tokens=4) for i in range(3)) + "\n")
        submitted = batchinfer(cluster_env, "submit", str(src), "--json")
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout)
        assert proc.wait(120) == 70
        assert "the engine process was killed by SIGKILL (out of memory?): this worker stops" in log.read_text()
        proc = _start_worker(cluster_env, log, name)  # its restart: the unit it held runs again
        watched = batchinfer(cluster_env, "status", job["id"], "--watch", "--json", timeout=300)
        final = json.loads(watched.stdout)
        assert final["status"] == "completed" and final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        out = tmp_path / "out.jsonl"
        assert batchinfer(cluster_env, "download", job["id"], "-o", str(out)).returncode == 0
        assert sorted(json.loads(line)["custom_id"] for line in out.read_text().splitlines()) == ["r0", "r1", "r2"]
    finally:
        _stop(proc)
