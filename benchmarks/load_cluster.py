"""The services of one load run: a fresh PostgreSQL database, Redis (a private redis-server, or a given one
under a fresh key prefix), S3 (a SeaweedFS server, or a given bucket) or local files, and N real
`batchinfer worker` processes. Everything it started is stopped by close()."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from batchinfer.context import AppContext
from batchinfer.settings import Settings, get_settings

from .support.services import RedisServer, SeaweedS3, create_database, drop_database, start_cli, stop
from .support.workers import start_worker, wait_live


class LoadCluster:
    def __init__(self, work: Path, postgres: str, redis: str = "start", storage: str = "s3", keep: bool = False):
        self.work, self.postgres_admin, self.keep = work, postgres, keep
        self.workers: dict[str, subprocess.Popen] = {}
        self._redis: RedisServer | None = None
        self._s3: SeaweedS3 | None = None
        self.database: str | None = None
        self.database_url = ""
        try:
            self._start(redis, storage)
        except BaseException:
            self.close()
            raise

    def _start(self, redis: str, storage: str) -> None:
        self.database, self.database_url = create_database(self.postgres_admin)
        if redis == "start":
            self._redis = RedisServer(self.work / "redis")
            redis = self._redis.url
        s3_env: dict[str, str] = {}
        if storage == "s3":
            self._s3 = SeaweedS3(self.work / "seaweedfs")
            s3_env = self._s3.env
            storage = f"s3://{self._s3.create_bucket()}/load"
        elif storage == "local":
            storage = f"file://{(self.work / 'files').resolve()}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHINFER_")} | s3_env | {
            "BATCHINFER_DATA_DIR": str((self.work / "data").resolve()), "BATCHINFER_DATABASE_URL": self.database_url,
            "BATCHINFER_BROKER_URL": f"{redis.rstrip('/')}/0" if redis.count("/") == 2 else redis,
            "BATCHINFER_BROKER_PREFIX": f"load-{uuid.uuid4().hex[:8]}:", "BATCHINFER_STORAGE_URL": storage,
            "BATCHINFER_MODEL_CACHE": str(get_settings().model_cache), "PYTHONUNBUFFERED": "1"}
        os.environ.update(s3_env)  # boto3 in this process (checks, status probe) reads them
        # The workers' settings, parsed from the same environment strings they get (pydantic converts them).
        values: dict[str, Any] = {k.removeprefix("BATCHINFER_").lower(): v for k, v in self.env.items()
                                  if k.startswith("BATCHINFER_")}
        self.settings = Settings(**values)
        self.ctx = AppContext.create(self.settings, migrate=False)
        self._cli("db", "upgrade")

    def _cli(self, *args: str) -> None:
        log = self.work / f"{args[0]}.log"
        proc = start_cli(self.env, log, *args)
        if proc.wait(300) != 0:
            raise RuntimeError(f"batchinfer {' '.join(args)} failed: {log.read_text(errors='replace')[-1500:]}")

    def start_workers(self, count: int, threads: int, timeout: float = 600) -> list[str]:
        """`batchinfer worker` processes, each with `threads` intra-op threads; returns once all beat."""
        names = [f"load{i}-{uuid.uuid4().hex[:4]}" for i in range(count)]
        env = self.env | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        started = {name: start_worker(env, self.work / f"worker-{name}.log", name) for name in names}
        self.workers.update(started)
        wait_live(self.settings, started, timeout, log_tail=lambda name: self.worker_log(name)[-1500:])
        return names

    def worker_log(self, name: str) -> str:
        return (self.work / f"worker-{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.workers.values():
            stop(proc)
        for server in (self._redis, self._s3):
            if server is not None:
                server.stop()
        if self.database and not self.keep:
            from batchinfer.db.session import dispose

            dispose(self.database_url)
            drop_database(self.postgres_admin, self.database)
