"""Batch controls on the production path (PostgreSQL + Redis + S3, a Celery worker process, the CLI): a paused batch
starts no new unit while its running ones finish, and a resume runs the rest; a batch past its max_error_rate stops
and ends failed with its finished results kept. Either way every custom_id comes back once."""
import json
import time

import pytest

from cli_helpers import batchinfer
from jobfiles import chat_line
from test_celery_e2e import _start_worker, _stop, cluster_env  # noqa: F401 (fixtures)


@pytest.fixture
def small_units_env(cluster_env):  # noqa: F811 (the fixture imported above)
    """Units of two requests: a batch spans many units, so a pause lands between them."""
    return {**cluster_env, "BATCHINFER_MAX_REQUESTS_PER_UNIT": "2", "BATCHINFER_UNIT_GROWTH": "1"}


@pytest.fixture
def worker(small_units_env, tmp_path):
    proc = _start_worker(small_units_env, tmp_path / "worker.log", "controls")
    try:
        yield
    finally:
        _stop(proc)


def _status(env, job_id: str) -> dict:
    found = batchinfer(env, "status", job_id, "--json")
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout)


def _settled(env, job_id: str, quiet_s: float = 4.0, limit_s: float = 120.0) -> dict:
    """The batch once its request counts stop moving for quiet_s (the units that were running have finished)."""
    last, since, deadline = None, time.time(), time.time() + limit_s
    while time.time() < deadline:
        batch = _status(env, job_id)
        if batch["request_counts"] != last:
            last, since = batch["request_counts"], time.time()
        elif time.time() - since >= quiet_s:
            return batch
        time.sleep(0.5)
    raise AssertionError(f"the counts kept moving: {last}")


def _custom_ids(env, job_id: str, tmp_path) -> list[str]:
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    got = batchinfer(env, "download", job_id, "-o", str(out), "--errors", str(errors))
    assert got.returncode == 0, got.stderr
    lines = [json.loads(x) for f in (out, errors) if f.exists() for x in f.read_text().splitlines()]
    return sorted(line["custom_id"] for line in lines)


def test_a_paused_batch_starts_no_new_unit_and_a_resume_runs_the_rest(small_units_env, worker, tmp_path):
    names = [f"p{i:02d}" for i in range(24)]
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join(chat_line(n, f"Write a sentence about the number {i}.", 24) for i, n in enumerate(names)) + "\n")
    job = json.loads(batchinfer(small_units_env, "submit", str(src), "--json").stdout)
    paused = batchinfer(small_units_env, "pause", job["id"], "--json")
    assert paused.returncode == 0 and json.loads(paused.stdout)["status"] == "paused", paused.stderr
    held = _settled(small_units_env, job["id"])
    assert held["status"] == "paused" and held["paused_at"]
    assert held["request_counts"]["completed"] < len(names), "the pause came after the whole batch ran"
    time.sleep(3)  # nothing starts while paused
    assert _status(small_units_env, job["id"])["request_counts"] == held["request_counts"]
    again = batchinfer(small_units_env, "pause", job["id"], "--json")  # pausing again answers as it is
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "paused"
    resumed = batchinfer(small_units_env, "resume", job["id"], "--json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] in ("queued", "in_progress"), resumed.stderr
    final = json.loads(batchinfer(small_units_env, "status", job["id"], "--watch", "--json", timeout=300).stdout)
    assert final["status"] == "completed" and final["request_counts"] == {"total": 24, "completed": 24, "failed": 0}
    assert _custom_ids(small_units_env, job["id"], tmp_path) == names
    refused = batchinfer(small_units_env, "resume", job["id"])
    assert refused.returncode != 0 and "Cannot resume a batch with status 'completed'" in refused.stderr


def test_a_batch_past_its_max_error_rate_stops_failed_keeping_its_results(small_units_env, worker, tmp_path):
    good = [f"g{i:02d}" for i in range(12)]
    bad = [f"b{i:02d}" for i in range(4)]  # refused bodies: failed requests of the batch
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join([chat_line(n, f"Name a colour number {i}.", 16) for i, n in enumerate(good)]
                             + [chat_line(n, "hi", 4, temperature=9) for n in bad]) + "\n")
    job = json.loads(batchinfer(small_units_env, "submit", str(src), "--json", "--metadata", "max_error_rate=0.2",
                                "--metadata", "max_error_rate_after=6").stdout)
    final = json.loads(batchinfer(small_units_env, "status", job["id"], "--watch", "--json", timeout=300).stdout)
    assert final["status"] == "failed", final
    (stopped,) = [e for e in final["errors"]["data"] if e["code"] == "max_error_rate_exceeded"]
    assert "over its max_error_rate 0.2" in stopped["message"]
    counts = final["request_counts"]
    assert counts["total"] == 16 and 0 < counts["completed"] < 12 and counts["completed"] + counts["failed"] == 16
    assert _custom_ids(small_units_env, job["id"], tmp_path) == sorted(good + bad)
