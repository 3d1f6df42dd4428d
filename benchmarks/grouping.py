"""Cross-job prefix grouping, measured on the real system: jobs mixing the same long system prompts,
run by real worker processes (Celery, Redis, SQL, storage), with grouping on and off side by side.

Each mode gets fresh workers, a fresh database and fresh files, then the same jobs are submitted at
once and dispatched together. Reported per mode: wall time, throughput, cached prompt tokens
against the optimum (every distinct prefix block computed once per cache scope, the planner's
estimate), and on how many workers each prefix group ran. With scopes > 1 the jobs belong to that
many tenants (cache scopes, round robin) that share the same system prompts: what scoping costs is
the optimum of one scope minus the optimum of the scoped jobs.
"""
from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .support.services import stop
from .support.workers import start_worker, wait_live

MODES = ("grouping", "fcfs")

_SUBJECTS = ["the warehouse", "the night shift", "the billing system", "the supplier contract", "the safety audit",
             "the support queue", "the data migration", "the quarterly budget", "the hiring plan", "the field team"]
_VERBS = ["must review", "should report on", "may escalate", "has to document", "is responsible for",
          "will coordinate", "needs to verify", "can postpone", "must never ignore", "should summarise"]
_OBJECTS = ["every delayed order", "all open incidents", "each invoice above the limit", "any customer complaint",
            "the weekly metrics", "overtime requests", "the inventory count", "access badge changes",
            "vendor payments", "the on-call rota"]
_RULES = ["within two working days", "before the Friday review", "with a written reason", "in the shared tracker",
          "after checking with legal", "unless the manager objects", "using the standard template",
          "and copy the regional lead", "in plain language", "with the ticket number"]
_QUESTIONS = ["Who handles a late shipment?", "What is the deadline for invoices?", "Can I skip the review?",
              "Where do I log incidents?", "Who approves overtime?", "What template should I use?",
              "When is the Friday review?", "Do I copy the regional lead?", "Is legal always involved?",
              "How fast must complaints be answered?"]


@dataclass
class GroupingBenchOptions:
    jobs: int = 4
    requests_per_job: int = 16
    system_prompts: int = 4
    system_prompt_sentences: int = 40  # about 14 tokens each
    max_tokens: int = 4
    workers: int = 2
    max_requests_per_unit: int = 8
    kv_cache_tokens: int | None = 2048  # per worker; None: the engine's default budget
    threads_per_worker: int = 1
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str | None = None  # None: SQLite in the run directory
    model_cache: str | None = None
    seed: int = 0
    scopes: int = 1  # cache scopes (tenants) the jobs are spread over, round robin
    modes: tuple[str, ...] = MODES
    out: str = "bench-results"
    timeout_s: float = 1800.0

    def __post_init__(self):
        for name in ("jobs", "requests_per_job", "system_prompts", "system_prompt_sentences", "max_tokens",
                     "workers", "max_requests_per_unit", "threads_per_worker", "scopes"):
            if getattr(self, name) < 1:
                raise ValueError(f"GroupingBenchOptions.{name} must be >= 1")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"GroupingBenchOptions.modes: unknown {bad}, choose from {MODES}")


@dataclass
class ModeResult:
    mode: str
    wall_s: float
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    optimum_cached_tokens: int  # every distinct block computed once in each cache scope
    one_scope_optimum_cached_tokens: int  # ... were all jobs in one scope: the difference is what scoping costs
    units: int
    workers_per_group: dict[str, int] = field(default_factory=dict)
    units_per_worker: dict[str, int] = field(default_factory=dict)

    @property
    def cached_vs_optimum(self) -> float:
        return self.cached_tokens / self.optimum_cached_tokens if self.optimum_cached_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.completion_tokens) / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s

    def to_dict(self) -> dict:
        return {**asdict(self), "cached_vs_optimum": round(self.cached_vs_optimum, 4),
                "tokens_per_s": round(self.tokens_per_s, 1), "requests_per_s": round(self.requests_per_s, 3)}


def make_jobs(options: GroupingBenchOptions) -> tuple[list[str], list[str]]:
    """System prompts and one JSONL text per job; every job mixes all system prompts in random order."""
    rng = random.Random(options.seed)
    systems = []
    for s in range(options.system_prompts):
        sentences = [f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                     f"{rng.choice(_RULES)}." for _ in range(options.system_prompt_sentences)]
        systems.append(f"You are the operations handbook assistant number {s} of the company. Rules:\n"
                       + "\n".join(f"{i + 1}. {text}" for i, text in enumerate(sentences)))
    jobs = []
    for j in range(options.jobs):
        lines = []
        for i in range(options.requests_per_job):
            system = rng.choice(systems)
            question = f"{rng.choice(_QUESTIONS)} (job {j}, request {i}, ref {rng.randint(1000, 9999)})"
            lines.append(json.dumps({"custom_id": f"job{j}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"model": "smollm2-135m-instruct", "max_tokens": options.max_tokens,
                                              "temperature": 0, "messages": [{"role": "system", "content": system},
                                                                             {"role": "user", "content": question}]}}))
        jobs.append("\n".join(lines) + "\n")
    return systems, jobs


def run_grouping_bench(options: GroupingBenchOptions, progress=print) -> dict:
    from batchinfer.settings import get_settings

    options.model_cache = options.model_cache or str(get_settings().model_cache)
    run_dir = Path(options.out) / f"grouping-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    _, jobs = make_jobs(options)
    results = [_run_mode(options, mode, run_dir, jobs, progress) for mode in options.modes]
    report: dict[str, Any] = {"benchmark": "cross-job prefix grouping", "options": asdict(options),
              "modes": {r.mode: r.to_dict() for r in results}}
    if {"grouping", "fcfs"} <= {r.mode for r in results}:
        on, off = (next(r for r in results if r.mode == m) for m in ("grouping", "fcfs"))
        report["throughput_gain"] = round(on.tokens_per_s / off.tokens_per_s, 3)
    path = Path(options.out) / "grouping.json"
    path.write_text(json.dumps(report, indent=2))
    report["json_path"] = str(path)
    return report


def _run_mode(options: GroupingBenchOptions, mode: str, run_dir: Path, jobs: list[str], progress) -> ModeResult:
    from batchinfer.context import AppContext
    from batchinfer.settings import Settings

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    data_dir = run_dir / mode
    values: dict[str, Any] = {"data_dir": data_dir, "broker_url": options.redis_url, "broker_prefix": prefix,
                              "model_cache": options.model_cache, "max_requests_per_unit": options.max_requests_per_unit,
                              "prefix_grouping": mode == "grouping"}
    if options.database_url:
        values["database_url"] = options.database_url
    settings = Settings(**values)
    if options.kv_cache_tokens:
        settings = settings.model_copy(update={"kv_cache_bytes": kv_cache_bytes_for(settings, options.kv_cache_tokens)})
    ctx = AppContext.create(settings, migrate=True)
    names = [f"{mode}-w{i}" for i in range(options.workers)]
    procs = {name: _start_worker(settings, name, options.threads_per_worker, data_dir) for name in names}
    try:
        progress(f"[{mode}] starting {len(names)} workers")
        wait_live(settings, procs, timeout=600)
        progress(f"[{mode}] workers ready; submitting {len(jobs)} jobs")
        started = time.time()
        job_ids = _submit_and_dispatch(ctx, jobs, options.scopes)
        _wait_done(ctx, job_ids, started + options.timeout_s, progress, mode)
        wall = time.time() - started
    finally:
        for proc in procs.values():
            stop(proc)
    return _collect(ctx, mode, job_ids, wall, options)


def kv_cache_bytes_for(settings, tokens: int) -> int:
    """The KV budget that holds `tokens` tokens in a worker's engine: the engine's own bytes per token, for
    the model and dtype the worker will run (bf16 halves them)."""
    from batchinfer.engine.loading.light_loader import model_config
    from batchinfer.engine.loading.loader import model_files_dir
    from batchinfer.engine.runner.model_runner import kv_bytes_per_token
    from batchinfer.runtime.engine_host import engine_config

    folder = model_files_dir(settings.model, settings.model_cache)
    return tokens * kv_bytes_per_token(model_config(folder), engine_config(settings))


def _start_worker(settings, name: str, threads: int, data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "BATCHINFER_DATA_DIR": str(settings.data_dir), "BATCHINFER_BROKER_URL": settings.broker_url,
           "BATCHINFER_BROKER_PREFIX": settings.broker_prefix, "BATCHINFER_MODEL_CACHE": str(settings.model_cache),
           "BATCHINFER_MAX_REQUESTS_PER_UNIT": str(settings.max_requests_per_unit),
           "BATCHINFER_PREFIX_GROUPING": "true" if settings.prefix_grouping else "false",
           "BATCHINFER_WORKER_BEAT_S": "1", "BATCHINFER_DTYPE": settings.dtype}
    if settings.database_url:
        env["BATCHINFER_DATABASE_URL"] = settings.database_url
    if settings.kv_cache_bytes:
        env["BATCHINFER_KV_CACHE_BYTES"] = str(settings.kv_cache_bytes)
    return start_worker(env, data_dir / f"{name}.log", name, "--loglevel", "WARNING")


def _submit_and_dispatch(ctx, jobs: list[str], scopes: int = 1) -> list[str]:
    """All jobs submitted at once, then one dispatch plans them together (as the dispatch task does). With
    scopes > 1, job j is a direct job of org bench-(j mod scopes): that many tenants who share nothing."""
    from batchinfer.jobs import service
    from workers.celery_app import make_app
    from batchinfer.cluster.broker import broker_priority
    from batchinfer.cluster.registry import open_registry
    from batchinfer.jobs.dispatch.planning import dispatch
    from workers.tasks import RUN_UNIT_TASK

    def tenant(j: int):
        if scopes == 1:
            return ctx
        return replace(ctx, settings=ctx.settings.model_copy(update={"direct_job_org": f"bench-{j % scopes}"}))

    job_ids = [service.submit(tenant(j), io.BytesIO(text.encode()), f"job{j}.jsonl").id for j, text in enumerate(jobs)]
    app = make_app(ctx.settings)
    loads = open_registry(ctx.settings).loads()
    for unit in dispatch(ctx, [w.name for w in loads], worker_loads=loads):
        app.send_task(RUN_UNIT_TASK, args=[unit.unit_id], queue=unit.queue, priority=broker_priority(unit.level))
    return job_ids


def _wait_done(ctx, job_ids: list[str], deadline: float, progress, mode: str) -> None:
    from batchinfer.jobs import service
    from batchinfer.db.models import JobStatus

    last = None
    while time.time() < deadline:
        jobs = [service.get(ctx, j) for j in job_ids]
        done = sum(j.completed + j.failed for j in jobs)
        if done != last:
            progress(f"[{mode}] {done}/{sum(j.total for j in jobs)} requests done")
            last = done
        if all(j.status in JobStatus.TERMINAL for j in jobs):
            return
        time.sleep(0.5)
    raise TimeoutError(f"[{mode}] jobs not finished in time")


def _collect(ctx, mode: str, job_ids: list[str], wall: float, options: GroupingBenchOptions) -> ModeResult:
    from sqlalchemy import select

    from batchinfer.jobs import record_store, service
    from batchinfer.db.models import WorkUnit
    from batchinfer.planner import estimate_plan
    from batchinfer.jobs.dispatch.planning import planner_config

    jobs = [service.get(ctx, j) for j in job_ids]
    pending = []
    for job in jobs:
        prepared = record_store.read_prepared(ctx.storage, job.id)
        pending += [prepared[i].to_pending(job.id, scope=job.cache_scope) for i in sorted(prepared)]
    optimum = estimate_plan(pending, planner_config(ctx)).expected_cached_tokens
    one_scope = estimate_plan([replace(r, scope="") for r in pending],
                              planner_config(ctx)).expected_cached_tokens
    with ctx.sessions() as session:
        units = list(session.scalars(select(WorkUnit)))
    groups: defaultdict[str, set[str | None]] = defaultdict(set)
    per_worker: defaultdict[str, int] = defaultdict(int)
    for unit in units:
        per_worker[unit.worker or "?"] += 1
        groups[unit.prefix_key or "(no group)"].add(unit.worker)
    return ModeResult(mode, round(wall, 2), sum(j.completed for j in jobs), sum(j.prompt_tokens for j in jobs),
                      sum(j.completion_tokens for j in jobs), sum(j.cached_tokens for j in jobs), optimum, one_scope,
                      len(units),
                      {k: len(v) for k, v in groups.items()}, dict(per_worker))


def print_report(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cross-job prefix grouping")
    for column in ("mode", "wall s", "requests", "prompt tok", "cached tok", "optimum", "one-scope optimum",
                   "cached/optimum",
                   "tok/s", "req/s", "units", "workers per group"):
        table.add_column(column, justify="right")
    for mode, r in report["modes"].items():
        table.add_row(mode, f"{r['wall_s']:.1f}", str(r["requests"]), str(r["prompt_tokens"]), str(r["cached_tokens"]),
                      str(r["optimum_cached_tokens"]), str(r["one_scope_optimum_cached_tokens"]),
                      f"{r['cached_vs_optimum']:.1%}", f"{r['tokens_per_s']:.0f}",
                      f"{r['requests_per_s']:.2f}", str(r["units"]),
                      " ".join(str(n) for n in sorted(r["workers_per_group"].values())))
    console = console or Console()
    console.print(table)
    if "throughput_gain" in report:
        console.print(f"throughput, grouping on / off: {report['throughput_gain']:.2f}x")


def bench_grouping_command(
    jobs: int = 4, requests_per_job: int = 16, system_prompts: int = 4, system_prompt_sentences: int = 40,
    max_tokens: int = 4, workers: int = 2, max_requests_per_unit: int = 8, kv_cache_tokens: int = 2048,
    threads_per_worker: int = 1, redis_url: str = "redis://127.0.0.1:6379/0", database_url: str = "",
    seed: int = 0, scopes: int = 1, mode: list[str] = list(MODES), out: str = "bench-results",  # noqa: B006
) -> None:
    """Prefix grouping on vs off: jobs sharing long system prompts, real workers; writes grouping.json.

    kv_cache_tokens 0 keeps the engine's default KV budget. scopes N spreads the jobs over N tenants (cache
    scopes) that share no cache: the optimum drops by what scoping costs.
    """
    options = GroupingBenchOptions(
        jobs=jobs, requests_per_job=requests_per_job, system_prompts=system_prompts,
        system_prompt_sentences=system_prompt_sentences, max_tokens=max_tokens, workers=workers,
        max_requests_per_unit=max_requests_per_unit, kv_cache_tokens=kv_cache_tokens or None,
        threads_per_worker=threads_per_worker, redis_url=redis_url, database_url=database_url or None, seed=seed,
        scopes=scopes, modes=tuple(m for item in mode for m in item.split(",") if m), out=out)
    report = run_grouping_bench(options, progress=lambda line: print(line, file=sys.stderr))
    print_report(report)
    print(f"raw results: {report['json_path']}")


if __name__ == "__main__":
    import typer

    typer.run(bench_grouping_command)
