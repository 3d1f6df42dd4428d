"""A fair share of validation and estimate work between keys in the cluster mode (issue 19, finding 6): a real
`batchinfer serve` and one real worker on PostgreSQL, Redis and S3. The validations and estimates go to the
worker through per-key queues in Redis (cluster/fair_queue.py), so one key's flood of big batches does not hold
back another key's one-line batch: sent first come first served, it would wait behind the whole flood."""
from __future__ import annotations

import json
import uuid

import pytest

from cli_helpers import batchinfer, cli_env, wait_for, wait_healthy
from test_api_fairness import FLOOD_BATCHES, flood_then_one_line, status
from benchmarks.support.services import free_port, start_cli, stop


@pytest.fixture
def cluster_server(tmp_path, model_cache, postgres_url, redis_server, s3_server, s3_bucket):
    """(base URL, the flooding key's headers, the other key's), with one worker live."""
    from batchinfer.cluster.registry import open_registry
    from batchinfer.settings import Settings

    broker, prefix = f"{redis_server}/0", f"bitest-{uuid.uuid4().hex[:8]}:"
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url,
                  BATCHINFER_STORAGE_URL=f"s3://{s3_bucket}/fair-{uuid.uuid4().hex[:8]}",
                  BATCHINFER_BROKER_URL=broker, BATCHINFER_BROKER_PREFIX=prefix, BATCHINFER_API_ESTIMATE_WAIT_S="5",
                  BATCHINFER_VALIDATION_STALE_S="600", **s3_server)  # no sweep hands a queued validation on early
    assert batchinfer(env, "db", "upgrade").returncode == 0
    auths = []
    for name in ("flooder", "other"):
        made = batchinfer(env, "keys", "create", "--name", name, "--json")
        assert made.returncode == 0, made.stderr
        auths.append({"Authorization": f"Bearer {json.loads(made.stdout)['key']}"})
    name, port = f"w{uuid.uuid4().hex[:6]}", free_port()
    worker = start_cli(env, tmp_path / "worker.log", "worker", "--name", name)
    server = start_cli(env, tmp_path / "server.log", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, tmp_path / "server.log")
        registry = open_registry(Settings(broker_url=broker, broker_prefix=prefix))
        wait_for(lambda: name in {w.name for w in registry.live()} or worker.poll() is not None, "the worker")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        yield url, *auths
    finally:
        stop(server)
        stop(worker)
        for log in ("server.log", "worker.log"):
            assert "Traceback" not in (tmp_path / log).read_text(errors="replace"), f"traceback in {log}"


def test_one_keys_flood_does_not_hold_back_another_keys_one_line_batch_on_the_workers(cluster_server):
    server, flooder, other = cluster_server[:1], *cluster_server[1:]
    mine, waited, still_validating = flood_then_one_line(server, flooder, other)
    # One worker validates one batch at a time: first come first served, the one-line batch would leave
    # `validating` after all 4 of the flood's; taken by key, it is the next taken after the one running.
    assert len(still_validating) >= FLOOD_BATCHES // 2, (still_validating, waited)
    assert status(server, other, mine) in {"queued", "in_progress", "finalizing", "completed"}
