"""Helpers for the fault matrix (fixtures in conftest.py): real worker processes, a private Redis and a private PostgreSQL that a
test may kill and restart (never the shared ones), and the checks every case makes on a finished job.

    cluster = fault_cluster(broker=private_redis().url, database=private_postgres.url)  # both optional
    cluster.start("w1", "w2")
    job_id = cluster.submit(lines)              # service.submit + one dispatch message
    unit = cluster.wait_unit_running()          # SIGSTOP-free: polls SQL for a unit marked running
    cluster.kill("w1")                          # SIGKILL (or cluster.signal("w1", signal.SIGTERM))
    job = cluster.wait_final(job_id)
    cluster.check(job, expect_status="completed")  # every custom_id once, counts == lines, no traceback

Recovery times go to stdout and, when BATCHINFER_FAULT_TIMINGS names a file, as JSON lines there.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from benchmarks.support.services import free_port, start_cli
from benchmarks.support.workers import live_incarnations, wait_live

MAX_TOKENS = 3
TRACEBACK = "Traceback (most recent call last)"


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.time() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # the service under test may be down for a moment
            value = None
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def pause(proc) -> None:
    """SIGSTOP a process group: it holds still where it is, so a case's window cannot close before its fault."""
    os.killpg(proc.pid, signal.SIGSTOP)


def resume(proc) -> None:
    os.killpg(proc.pid, signal.SIGCONT)


def record_recovery(case: str, seconds: float, **extra) -> None:
    entry = {"case": case, "recovery_s": round(seconds, 2), **extra}
    print(f"recovery: {json.dumps(entry)}")
    target = os.environ.get("BATCHINFER_FAULT_TIMINGS")
    if target:
        with open(target, "a") as out:
            out.write(json.dumps(entry) + "\n")


def job_lines(prefix: str, n: int, max_tokens: int = MAX_TOKENS, **body) -> list[str]:
    return [json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": "smollm2-135m-instruct", "prompt": f"Item {i} of {prefix}:",
                                 "max_tokens": max_tokens, "temperature": 0, **body}}) for i in range(n)]


# ---- a private Redis ------------------------------------------------------------------------------

class PrivateRedis:
    """redis-server on a free port in a temp dir; restart() with or without what it had (AOF)."""

    def __init__(self, root: Path, persist: bool = False):
        self.root, self.persist, self.port = root, persist, free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--dir", str(self.root), *persistence],
                                     stdout=open(self.root / "redis.log", "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_for(self.ping, 20, "private redis")

    def ping(self) -> bool:
        import redis

        return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())

    def kill(self) -> None:
        """SIGKILL: without persistence every key is gone; with AOF (fsync always) everything comes back."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, down_s: float = 1.0) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()


# ---- a private PostgreSQL -------------------------------------------------------------------------

def _pg_bin(tool: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))
    if not found:
        pytest.skip(f"no {tool} under /usr/lib/postgresql/*/bin")
    return str(found[-1])


class PrivatePostgres:
    """A second PostgreSQL cluster (initdb + pg_ctl) on a free port in a temp dir, run as the postgres
    user when we are root (initdb refuses root). restart() stops it fast and starts it again."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="bi-pg-"))
        self.data, self.port = self.root / "data", free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"), "-o", options,
                  "-w", "-t", "60", action, *extra)

    def start(self) -> None:
        self._ctl("start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def restart(self, down_s: float = 1.0) -> None:
        self.stop("immediate")  # as a crash: connections drop mid-transaction
        time.sleep(down_s)
        self.start()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except AssertionError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


# ---- workers and jobs -----------------------------------------------------------------------------

class FaultCluster:
    """Settings shared by this test and its worker processes; the workers; and the per-case checks."""

    def __init__(self, tmp_path: Path, database_url: str, broker_url: str, storage_url: str, model_cache: str,
                 s3_env: dict, **extra: str):
        from batchinfer.settings import Settings

        self.env = {"BATCHINFER_DATA_DIR": str(tmp_path / "data"), "BATCHINFER_DATABASE_URL": database_url,
                    "BATCHINFER_BROKER_URL": f"{broker_url}/0", "BATCHINFER_BROKER_PREFIX": f"f-{uuid.uuid4().hex[:8]}:",
                    "BATCHINFER_STORAGE_URL": storage_url, "BATCHINFER_MODEL_CACHE": model_cache,
                    "BATCHINFER_MAX_REQUESTS_PER_UNIT": "2", "BATCHINFER_WORKER_BEAT_S": "0.5",
                    "BATCHINFER_WORKER_TTL_S": "3", "BATCHINFER_SWEEP_INTERVAL_S": "0.5",
                    "BATCHINFER_DISPATCH_COUNTDOWN_S": "0.2", **extra}
        self.s3_env = s3_env
        self.settings = Settings(**{k.removeprefix("BATCHINFER_").lower(): v for k, v in self.env.items()})
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list[Path] = []
        self._ctx = None

    # workers
    def start(self, *names: str, timeout: float = 240, wait: bool = True) -> None:
        self.context()  # the schema exists before any worker sweeps
        before = live_incarnations(self.settings)
        for name in names:
            self.procs[name] = self.start_cli(name, "worker", "--name", name, "--loglevel", "INFO")
        if wait:
            self.wait_live(*names, timeout=timeout, not_incarnations=before)

    def wait_live(self, *names: str, timeout: float = 240, not_incarnations: dict | None = None) -> None:
        """Until each worker beats, as a new process (a killed one's key may outlive it for the TTL)."""
        wait_live(self.settings, {name: self.procs[name] for name in names}, timeout, not_incarnations, self.log_tail)

    def start_cli(self, name: str, *args: str) -> subprocess.Popen:
        """`batchinfer ARGS` with this cluster's settings, in its own process group; its output (stdout and
        stderr) joins the logs that assert_no_traceback reads."""
        path = self.tmp_path / f"{name}-{len(self.logs)}.log"
        self.logs.append(path)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **self.s3_env, **self.env}
        return start_cli(env, path, *args)

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)

    def kill(self, name: str) -> float:
        """SIGKILL the worker's whole process group; returns when it happened."""
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(20)
        return time.time()

    def output(self, name: str) -> str:
        """What the last process started as `name` printed."""
        paths = [p for p in self.logs if p.name.startswith(f"{name}-")]
        return paths[-1].read_text(errors="replace") if paths else ""

    def log_tail(self, name: str, chars: int = 3000) -> str:
        paths = [p for p in self.logs if p.name.startswith(f"{name}-")]
        return paths[-1].read_text(errors="replace")[-chars:] if paths else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def serve(self, timeout: float = 120) -> dict:
        """`batchinfer serve` on a free port with an API key: the env a CLI needs to submit through it."""
        import httpx

        made = self.cli("keys", "create", "--name", "faults", "--json")
        assert made.returncode == 0, made.stderr
        port = free_port()
        self.procs["api"] = self.start_cli("api", "serve", "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self.procs["api"].poll() is None and httpx.get(f"{url}/health").status_code == 200,
                 timeout, f"the API server:\n{self.log_tail('api')}")
        return {"BATCHINFER_API_URL": url, "BATCHINFER_API_KEY": json.loads(made.stdout)["key"]}

    def cli(self, *args: str, timeout: float = 180):
        """`batchinfer ARGS` as an operator runs it against this cluster (completed process, text output)."""
        from cli_helpers import batchinfer

        return batchinfer({**os.environ, "PYTHONUNBUFFERED": "1", **self.s3_env, **self.env}, *args, timeout=timeout)

    # services
    def context(self):
        if self._ctx is None:
            from batchinfer.context import AppContext

            self._ctx = AppContext.create(self.settings, migrate=True)
        return self._ctx

    def registry(self):
        from batchinfer.cluster.registry import open_registry

        return open_registry(self.settings)

    def submit(self, lines: list[str], **kwargs) -> str:
        from batchinfer.jobs.dispatch.routing import SHARED_QUEUE
        from batchinfer.jobs import service
        from workers.celery_app import make_app
        from workers.tasks import DISPATCH_TASK

        data = ("\n".join(lines) + "\n").encode()
        job = service.submit(self.context(), io.BytesIO(data), "faults.jsonl", **kwargs)
        make_app(self.settings).send_task(DISPATCH_TASK, queue=SHARED_QUEUE)
        return job.id

    # observations
    def units(self):
        from sqlalchemy import select

        from batchinfer.db.models import WorkUnit

        with self.context().sessions() as session:
            return list(session.scalars(select(WorkUnit)))

    def wait_unit_running(self, worker: str | None = None, timeout: float = 180):
        """The first unit marked running (on `worker`), polled fast so a kill lands mid-unit."""
        def running():
            return next((u for u in self.units() if u.status == "running" and worker in (None, u.worker)), None)
        return wait_for(running, timeout, f"a unit running on {worker or 'any worker'}", every=0.02)

    def jobs(self):
        from batchinfer.jobs import service

        return service.list_jobs(self.context(), limit=1000)

    def request_rows(self, job_id: str) -> int:
        from sqlalchemy import func, select

        from batchinfer.db.models import Request

        with self.context().sessions() as session:
            return session.scalar(select(func.count()).select_from(Request).where(Request.job_id == job_id))

    def wait_validation_underway(self, timeout: float = 180) -> str:
        """The id of the first job still `validating` with request rows committed: its validation is mid-file."""
        from sqlalchemy import exists, select

        from batchinfer.db.models import Job, Request

        def underway():
            with self.context().sessions() as session:
                return session.scalar(select(Job.id).where(Job.status == "validating",
                                                           exists().where(Request.job_id == Job.id)).limit(1))
        return wait_for(underway, timeout, "a validation with its first rows committed", every=0.02)

    def generating_s(self, since: float) -> float:
        """Seconds units spent running (their last attempt) after `since`: what of a recovery time is the
        work that was left, not the recovery."""
        return round(sum(u.finished_at - max(u.started_at, since) for u in self.units()
                         if u.finished_at and u.started_at and u.finished_at > since), 2)

    def job(self, job_id: str):
        from batchinfer.jobs import service

        return service.get(self.context(), job_id)

    def wait_final(self, job_id: str, timeout: float = 180):
        from batchinfer.db.models import JobStatus

        def final():
            job = self.job(job_id)
            return job if job.status in JobStatus.TERMINAL else None
        try:
            return wait_for(final, timeout, f"job {job_id} to end", every=0.2)
        except AssertionError:
            job = self.job(job_id)
            units = [(u.id[-6:], u.status, u.worker, u.attempts, u.last_error) for u in self.units()]
            tails = "\n".join(f"--- {n}\n{self.log_tail(n, 1500)}" for n in self.procs)
            raise AssertionError(f"job {job_id} stuck {job.status} ({job.completed}/{job.failed}); units {units}\n{tails}") from None

    def files(self, job_id: str) -> tuple[list[dict], list[dict]]:
        from batchinfer.jobs import service

        found = []
        for errors in (False, True):
            target = io.BytesIO()
            service.download(self.context(), job_id, target, errors=errors)
            found.append([json.loads(line) for line in target.getvalue().splitlines() if line.strip()])
        return found[0], found[1]

    def check(self, job, lines: list[str], expect_status: str, expect_completed: int | None = None,
              stderr: list[str] = ()) -> tuple[list[dict], list[dict]]:
        """The four assertions of every case: final status; each custom_id exactly once across output and
        errors; the job's counts equal the files' lines; no traceback in any worker log or given stderr."""
        assert job.status == expect_status, (job.status, job.errors)
        outputs, errors = self.files(job.id)
        ids = [o["custom_id"] for o in outputs] + [e["custom_id"] for e in errors]
        wanted = [json.loads(line)["custom_id"] for line in lines]
        assert sorted(ids) == sorted(wanted), f"custom_ids differ: {sorted(ids)} vs {sorted(wanted)}"
        assert (job.completed, job.failed, job.total) == (len(outputs), len(errors), len(lines)), \
            ((job.completed, job.failed, job.total), (len(outputs), len(errors), len(lines)))
        if expect_completed is not None:
            assert job.completed == expect_completed, (job.completed, [e["error"] for e in errors])
        self.assert_no_traceback(*stderr)
        return outputs, errors

    def assert_not_logged(self, *phrases: str) -> None:
        """No process output (workers, CLI commands) mentions any of `phrases`, case-insensitive."""
        for path in self.logs:
            text = path.read_text(errors="replace").lower()
            for phrase in phrases:
                assert phrase.lower() not in text, f"{phrase!r} in {path.name}:\n{text[text.index(phrase.lower()) - 1500:][:3000]}"

    def assert_no_traceback(self, *extra: str) -> None:
        for path in self.logs:
            text = path.read_text(errors="replace")
            assert TRACEBACK not in text, f"traceback in {path.name}:\n{text[text.index(TRACEBACK) - 500:][:4000]}"
        for text in extra:
            assert TRACEBACK not in text, text[-3000:]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def slow_lines(prefix: str, n: int, max_tokens: int = MAX_TOKENS) -> list[str]:
    """Requests with a few hundred prompt tokens each, so a unit runs long enough to be hit mid-way."""
    filler = " ".join(f"word{k}" for k in range(120))
    return [json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": "smollm2-135m-instruct", "prompt": f"{prefix} item {i}: {filler}",
                                 "max_tokens": max_tokens, "temperature": 0}}) for i in range(n)]
