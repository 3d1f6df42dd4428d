"""Fixtures of the fault matrix (the helpers themselves are in faultlib.py, for b2's cases too):
private_redis(persist=...), private_postgres, private_s3, fault_cluster(broker=..., database=..., s3=..., **env)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from faultlib import FaultCluster, PrivatePostgres, PrivateRedis


@pytest.fixture
def private_redis(tmp_path):
    made = []

    def make(persist: bool = False) -> PrivateRedis:
        root = tmp_path / f"redis-{len(made)}"
        root.mkdir()
        made.append(PrivateRedis(root, persist))
        return made[-1]

    yield make
    for r in made:
        r.kill()


@pytest.fixture
def private_postgres():
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.skip("root without runuser: cannot run initdb")
    pg = PrivatePostgres()
    yield pg
    from batchinfer.db.session import dispose

    dispose(pg.url)
    pg.destroy()


@pytest.fixture
def private_s3(tmp_path, monkeypatch, s3_server):
    """A SeaweedFS of this test's own (kill() and start() it); this process's boto3 talks to it too."""
    from benchmarks.support.services import SeaweedS3

    server = SeaweedS3(tmp_path / "seaweedfs")
    server.bucket = server.create_bucket()
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    yield server
    server.stop()


@pytest.fixture
def fault_cluster(tmp_path, model_cache, postgres_url, redis_server, s3_url, s3_server):
    """fault_cluster(broker=..., database=..., s3=private_s3, **env): the shared PostgreSQL, Redis and S3
    unless a private one is given."""
    made: list[FaultCluster] = []

    def make(broker: str | None = None, database: str | None = None, s3=None, **extra: str) -> FaultCluster:
        storage, s3_env = (f"s3://{s3.bucket}/jobs-prefix", s3.env) if s3 is not None else (s3_url, s3_server)
        made.append(FaultCluster(tmp_path, database or postgres_url, broker or redis_server, storage, model_cache,
                                 s3_env, **extra))
        return made[-1]

    yield make
    import redis as redis_lib

    for c in made:
        c.stop()
        try:
            conn = redis_lib.Redis.from_url(c.settings.broker_url, socket_timeout=2)
            for key in conn.scan_iter(match=c.settings.broker_prefix + "*"):
                conn.delete(key)
        except Exception:
            pass


def pytest_collection_modifyitems(config, items):
    """Every case in this folder carries the `faults` marker (`pytest -m faults` runs the matrix alone)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
