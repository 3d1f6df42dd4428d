"""Fixtures of the fault matrix (the helpers themselves are in faultlib.py, for b2's cases too):
private_redis(persist=...), private_postgres, fault_cluster(broker=..., database=..., **env)."""
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
def fault_cluster(tmp_path, model_cache, postgres_url, redis_server, s3_url, s3_server):
    """fault_cluster(broker=..., database=..., **env): shared PostgreSQL/Redis unless a private one is given."""
    made: list[FaultCluster] = []

    def make(broker: str | None = None, database: str | None = None, **extra: str) -> FaultCluster:
        made.append(FaultCluster(tmp_path, database or postgres_url, broker or redis_server, s3_url, model_cache,
                                 s3_server, **extra))
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
