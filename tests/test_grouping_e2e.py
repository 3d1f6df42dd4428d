"""Prefix grouping end to end: real Redis, PostgreSQL and two real Celery worker processes started
from `batchinfer worker`, running the real model."""
from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import pytest
import redis

from batchinfer.jobs.views.reports import job_prefix_report
from batchinfer.jobs.dispatch.routing import worker_queue

pytestmark = pytest.mark.timeout(400)

SENTENCE_PARTS = (["the warehouse", "the night shift", "the billing desk", "the audit team", "the field crew"],
                  ["must review", "should report", "may escalate", "has to log", "will verify"],
                  ["every late order", "open incidents", "large invoices", "each complaint", "weekly numbers"],
                  ["within two days", "before Friday", "with a reason", "in the tracker", "in plain words"])


def system_prompt(rng: random.Random, n: int) -> str:
    rules = [" ".join(rng.choice(part) for part in SENTENCE_PARTS) + "." for _ in range(12)]
    return f"You are handbook assistant {n}. Follow these rules:\n" + "\n".join(rules)


def job_file(rng: random.Random, systems: list[str], job: int, requests: int, max_tokens: int) -> bytes:
    lines = []
    for i in range(requests):
        messages = [{"role": "system", "content": systems[(i + job) % len(systems)]},
                    {"role": "user", "content": f"Question {i} of job {job}: what comes first? ({rng.randint(0, 999)})"}]
        lines.append(json.dumps({"custom_id": f"j{job}-r{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": "smollm2-135m-instruct", "messages": messages,
                                          "max_tokens": max_tokens, "temperature": 0}}))
    return ("\n".join(lines) + "\n").encode()


class Cluster:
    """Settings shared by this test process and its worker processes, and the workers themselves."""

    def __init__(self, tmp_path, postgres_url, redis_url, model_cache, **extra):
        from batchinfer.settings import Settings

        self.env = {"BATCHINFER_DATA_DIR": str(tmp_path / "data"), "BATCHINFER_DATABASE_URL": postgres_url,
                    "BATCHINFER_BROKER_URL": f"{redis_url}/0", "BATCHINFER_BROKER_PREFIX": f"t-{uuid.uuid4().hex[:8]}:",
                    "BATCHINFER_MODEL_CACHE": model_cache, "BATCHINFER_MAX_REQUESTS_PER_UNIT": "2",
                    "BATCHINFER_WORKER_BEAT_S": "0.5", "BATCHINFER_WORKER_TTL_S": "3", **extra}
        self.settings = Settings(**{k.removeprefix("BATCHINFER_").lower(): v for k, v in self.env.items()})
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}

    def context(self):
        from batchinfer.context import AppContext

        return AppContext.create(self.settings, migrate=True)

    def registry(self):
        from batchinfer.cluster.registry import WorkerRegistry

        return WorkerRegistry(redis.Redis.from_url(self.settings.broker_url), self.settings.broker_prefix)

    def start(self, *names: str, timeout: float = 180) -> None:
        for name in names:
            log = open(self.tmp_path / f"{name}.log", "wb")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "batchinfer.cli", "worker", "--name", name, "--loglevel", "INFO"],
                env={**os.environ, "OMP_NUM_THREADS": "1", **self.env}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.time() + timeout
        while not set(names) <= {w.name for w in self.registry().live()}:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"worker {name} exited: {self.log(name)[-3000:]}"
            assert time.time() < deadline, "workers did not come up"
            time.sleep(0.3)

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "batchinfer.cli", *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():  # the test is over: no need for a warm shutdown
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        conn = redis.Redis.from_url(self.settings.broker_url)
        for key in conn.scan_iter(match=self.settings.broker_prefix + "*"):
            conn.delete(key)

    def submit(self, ctx, files: list[bytes]) -> list[str]:
        from batchinfer.jobs import service
        from workers.celery_app import make_app
        from workers.tasks import DISPATCH_TASK

        from batchinfer.jobs.dispatch.routing import SHARED_QUEUE

        ids = [service.submit(ctx, io.BytesIO(data), f"job{n}.jsonl").id for n, data in enumerate(files)]
        make_app(self.settings).send_task(DISPATCH_TASK, queue=SHARED_QUEUE)  # one dispatch plans all jobs together
        return ids

    def wait_done(self, ctx, job_ids: list[str], timeout: float = 240) -> list:
        from batchinfer.jobs import service
        from batchinfer.db.models import JobStatus

        deadline = time.time() + timeout
        while time.time() < deadline:
            jobs = [service.get(ctx, j) for j in job_ids]
            if all(j.status in JobStatus.TERMINAL for j in jobs):
                return jobs
            time.sleep(0.3)
        logs = "\n".join(f"--- {n}\n{self.log(n)[-2000:]}" for n in self.procs)
        raise AssertionError(f"jobs not finished: {[(j.id, j.status, j.completed) for j in jobs]}\n{logs}")


@pytest.fixture
def cluster(tmp_path, postgres_url, redis_server, model_cache):
    made = []

    def make(**extra):
        made.append(Cluster(tmp_path, postgres_url, redis_server, model_cache, **extra))
        return made[-1]

    yield make
    for c in made:
        c.stop()


def units_of(ctx):
    from sqlalchemy import select

    from batchinfer.db.models import WorkUnit

    with ctx.sessions() as session:
        return list(session.scalars(select(WorkUnit)))


def outputs(ctx, job_id: str) -> list[dict]:
    from batchinfer.jobs import service

    buf = io.BytesIO()
    service.download(ctx, job_id, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_each_prefix_group_stays_on_one_worker_while_both_workers_run(cluster):
    # Stealing is off here so that what this pins down is the routing; idle-stealing has its own test.
    c = cluster(BATCHINFER_WORKER_STEAL="false")
    c.start("w1", "w2")
    rng = random.Random(0)
    systems = [system_prompt(rng, n) for n in range(4)]
    ctx = c.context()
    job_ids = c.submit(ctx, [job_file(rng, systems, j, 8, 2) for j in range(2)])
    jobs = c.wait_done(ctx, job_ids)
    assert [(j.status, j.failed) for j in jobs] == [("completed", 0), ("completed", 0)]
    units = units_of(ctx)
    workers_of = defaultdict(set)
    for unit in units:
        assert unit.prefix_key and unit.status == "done"
        workers_of[unit.prefix_key].add(unit.worker)
        assert unit.queue == worker_queue(unit.worker)  # it ran where routing sent it
    assert len(workers_of) == 4 and all(len(w) == 1 for w in workers_of.values()), workers_of
    span = {w: (min(u.started_at for u in units if u.worker == w), max(u.finished_at for u in units if u.worker == w))
            for w in ("w1", "w2")}
    assert min(end for _, end in span.values()) > max(start for start, _ in span.values()), span  # both ran at once
    assert sorted(sum(1 for u in units if u.worker == w) for w in ("w1", "w2")) == [4, 4], [u.worker for u in units]
    per_unit = defaultdict(lambda: [0, 0])
    for job in jobs:
        lines = outputs(ctx, job.id)
        assert sum(line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for line in lines) \
            == job.cached_tokens
        report = job_prefix_report(ctx, job.id)
        assert sum(g["cached_tokens"] for g in report["groups"]) == job.cached_tokens
        assert sorted(g["prefix_key"] for g in report["groups"]) == sorted(workers_of)
        for u in report["units"]:
            per_unit[u["unit_id"]][0] += u["prompt_tokens"]
            per_unit[u["unit_id"]][1] += u["cached_tokens"]
    shown = json.loads(c.cli("status", job_ids[0], "--json"))  # what `batchinfer status` shows per group
    assert {g["prefix_key"] for g in shown["prefix_groups"]} == set(workers_of)
    assert sum(g["cached_tokens"] for g in shown["prefix_groups"]) == jobs[0].cached_tokens
    assert all(g["done"] == g["requests"] and len(g["workers"]) == 1 for g in shown["prefix_groups"])
    for key in workers_of:  # a group's later units find its prefix cached on its worker
        later = sorted((u for u in units if u.prefix_key == key), key=lambda u: u.started_at)[1:]
        assert later and all(per_unit[u.id][1] > 0.6 * per_unit[u.id][0] for u in later), (key, dict(per_unit))


def test_a_killed_workers_units_are_rerun_elsewhere_nothing_lost_or_counted_twice(cluster):
    c = cluster()
    c.start("w1", "w2")
    rng = random.Random(1)
    systems = [system_prompt(rng, n) for n in range(4)]
    ctx = c.context()
    job_ids = c.submit(ctx, [job_file(rng, systems, 0, 12, 16)])
    registry, deadline = c.registry(), time.time() + 120
    while not (running := [u.id for u in units_of(ctx) if u.status == "running" and u.worker == "w1"]):
        assert time.time() < deadline, "w1 never started a unit"
        time.sleep(0.05)
    running = running[0]
    queued_for_w1 = registry.queue_depth(worker_queue("w1"))
    assert queued_for_w1 >= 1
    c.kill("w1")
    killed_at = time.time()
    [job] = c.wait_done(ctx, job_ids)
    assert job.status == "completed" and job.completed == job.total == 12 and job.failed == 0
    lines = outputs(ctx, job.id)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"j0-r{i}" for i in range(12))
    assert sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines) == job.prompt_tokens
    units = {u.id: u for u in units_of(ctx)}
    assert all(u.status == "done" for u in units.values())
    assert units[running].worker == "w2" and units[running].attempts >= 2  # rerun elsewhere
    late = [u for u in units.values() if u.queue == worker_queue("w1") and u.finished_at > killed_at]
    assert len(late) >= queued_for_w1 and all(u.worker == "w2" for u in late)
    assert "w1" not in {w.name for w in registry.live()}


def test_plan_prints_requests_tokens_groups_and_expected_cache_before_anything_runs(tmp_path, model_cache,
                                                                                     monkeypatch):
    from typer.testing import CliRunner

    from batchinfer.cli.app import app
    from batchinfer.settings import get_settings

    rng = random.Random(2)
    systems = [system_prompt(rng, n) for n in range(3)]
    path = tmp_path / "job.jsonl"
    path.write_bytes(job_file(rng, systems, 0, 9, 5))
    monkeypatch.setenv("BATCHINFER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("BATCHINFER_MODEL_CACHE", model_cache)
    monkeypatch.delenv("BATCHINFER_BROKER_URL", raising=False)
    get_settings.cache_clear()
    try:
        for command in (["plan", str(path), "--json"], ["submit", "--dry-run", "--json", str(path)]):
            done = CliRunner().invoke(app, command)
            assert done.exit_code == 0, done.output
            plan = json.loads(done.stdout)
            assert plan["requests"] == 9 and plan["prefix_groups"] == 3 and plan["max_new_tokens"] == 45
            assert 0.5 * plan["prompt_tokens"] < plan["expected_cached_tokens"] < plan["prompt_tokens"]
            assert plan["estimated_run_s"] > 0 and plan["workers"] == 1
    finally:
        get_settings.cache_clear()
    assert not (tmp_path / "data" / "files" / "jobs").exists()  # nothing was submitted
