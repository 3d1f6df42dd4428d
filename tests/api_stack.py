"""A real `batchinfer serve` and one worker on PostgreSQL, Redis and S3, as a client of OpenAI's or Anthropic's
API meets it: the conformance tests' server, and the one the peer suite runs against (scripts/peer_suite.py)."""
from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from benchmarks.support.services import create_database, drop_database, free_port, start_cli, stop
from cli_helpers import batchinfer, cli_env, wait_healthy

MODEL = "smollm2-135m-instruct"


@dataclass
class Stack:
    url: str  # http://127.0.0.1:PORT
    env: dict  # the CLI's environment on the server's machine
    root: Path

    def new_key(self, name: str = "tenant") -> str:
        made = batchinfer(self.env, "keys", "create", "--name", name, "--json")
        assert made.returncode == 0, made.stderr
        return json.loads(made.stdout)["key"]


@contextmanager
def serve_stack(root: Path, model_cache: str, postgres_admin: str, redis_url: str, s3_env: dict, bucket: str,
                **settings: str) -> Iterator[Stack]:
    """A fresh database and S3 prefix, one worker and one server; `settings` are further BATCHINFER_* values.
    Fails at the end if either process logged a traceback."""
    db, db_url = create_database(postgres_admin)
    env = cli_env(root, model_cache, BATCHINFER_DATABASE_URL=db_url,
                  BATCHINFER_STORAGE_URL=f"s3://{bucket}/stack-{uuid.uuid4().hex[:8]}",
                  BATCHINFER_BROKER_URL=f"{redis_url}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.3", **s3_env, **settings)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    worker = start_cli(env, root / "worker.log", "worker", "--name", f"w{uuid.uuid4().hex[:6]}")
    port = free_port()
    server = start_cli(env, root / "server.log", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, root / "server.log")
        yield Stack(url, env, root)
    finally:
        stop(server)
        stop(worker)
        drop_database(postgres_admin, db)
        for log in ("server.log", "worker.log"):
            assert "Traceback" not in (root / log).read_text(errors="replace"), f"traceback in {root / log}"
