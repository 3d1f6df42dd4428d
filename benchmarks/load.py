"""`batchinfer bench load`: the load case. J jobs x R requests, each job submitted by its own
`batchinfer submit` process, all at once, to N real `batchinfer worker` processes over PostgreSQL, Redis and
S3; `status` asked throughout; then every job checked (completed, each custom_id exactly once, counts equal
lines). Reports wall time, throughput, the pipeline's overhead per request (load_checks), peak memory of
workers and submits, and status latency."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import select

from batchinfer.db.models import Job, JobStatus

from .load_checks import check_jobs, end_time, time_split, tracebacks
from .load_cluster import LoadCluster
from .load_probes import CliStatusProbe, PeakMemory, StatusProbe, latency_summary, status_phases
from .load_workload import write_job_files

STATUS_TARGET_MS = 200


@dataclass
class LoadOptions:
    jobs: int = 50
    requests: int = 1000
    workers: int = 2
    max_tokens: int = 1
    system_prompts: int = 4
    postgres: str = "postgresql://postgres@127.0.0.1:5432/postgres"  # a server: the run creates its own database
    redis: str = "start"  # start: a private redis-server; else a redis:// URL (a fresh key prefix is used)
    storage: str = "s3"  # s3: start SeaweedFS; local: files under the work dir; or s3://bucket/prefix
    threads_per_worker: int = 0  # 0: the cores divided among the workers
    status_every_s: float = 0.1
    cli_status_every_s: float = 30.0  # 0: no `batchinfer status` processes
    timeout_s: float = 7200.0
    keep: bool = False  # keep the database (it is dropped otherwise)

    def __post_init__(self):
        for name in ("jobs", "requests", "workers", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.storage in ("s3", "local") or self.storage.startswith("s3://")):
            raise ValueError(f"storage must be s3, local or s3://bucket/prefix, got {self.storage!r}")
        if not (self.redis == "start" or self.redis.startswith("redis://")):
            raise ValueError(f"redis must be start or a redis:// URL, got {self.redis!r}")
        if self.threads_per_worker == 0:
            self.threads_per_worker = max(1, len(os.sched_getaffinity(0)) // self.workers)


def run_load(options: LoadOptions, work: Path, progress=print) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    files = write_job_files(work / "inputs", options.jobs, options.requests, options.system_prompts, options.max_tokens)
    progress(f"starting services and {options.workers} workers (work dir {work})")
    cluster = LoadCluster(work, options.postgres, options.redis, options.storage, options.keep)
    try:
        names = cluster.start_workers(options.workers, options.threads_per_worker)
        return _measure(options, cluster, names, files, progress)
    finally:
        cluster.close()


def _measure(options: LoadOptions, cluster: LoadCluster, names: list[str], files: list[Path], progress) -> dict:
    memory = PeakMemory()
    for name in names:
        memory.watch(f"worker:{name}", cluster.workers[name])
    status = StatusProbe(cluster.ctx, options.jobs, options.status_every_s)
    cli_probe = (CliStatusProbe(cluster.env, lambda: status.job_ids, options.cli_status_every_s)
                 if options.cli_status_every_s > 0 else None)
    probes = [memory, status, *([cli_probe] if cli_probe else [])]
    for probe in probes:
        probe.start()
    progress(f"submitting {options.jobs} jobs x {options.requests} requests at once")
    started = time.time()
    submits = _submit_all(cluster, files, memory)
    try:
        final_at = _wait_final(cluster, submits, options, started, progress)
    finally:
        for probe in probes:
            probe.stop()
    progress("checking outputs")
    checks, outputs = check_jobs(cluster.ctx, [f.name for f in files], options.requests)
    submit_results = _collect(submits)
    checks["submit_failures"] = [r for r in submit_results if r["rc"] != 0][:10]
    logs = {f"worker {n}": cluster.worker_log(n) for n in names} | {f"submit {r['file']}": r["stderr"] for r in submit_results}
    checks["tracebacks"] = tracebacks(logs)[:5]
    checks["ok"] = checks["ok"] and not checks["submit_failures"] and not checks["tracebacks"] and final_at is not None
    checks["timed_out"] = final_at is None
    final_at = final_at or time.time()
    wall = final_at - started
    total = options.jobs * options.requests
    return {
        "options": asdict(options), "workers": names, "wall_s": round(wall, 2),
        "requests": total, "requests_per_s": round(total / wall, 1),
        "submit_wall_s": latency_summary([r["wall_s"] for r in submit_results]),
        "time_split": time_split(cluster.ctx, outputs, options.workers, started, final_at, total),
        "peak_rss": {"worker": memory.peak_mib("worker:"), "submit": memory.peak_mib("submit:")},
        "status": {**latency_summary(status.status_s), "target_ms": STATUS_TARGET_MS, "errors": status.errors[:5],
                   **status_phases(status.status_at, status.status_s, _submits_done_at(submits, started))},
        "status_samples": [[round(at - started, 2), round(s * 1000, 1)] for at, s in zip(status.status_at, status.status_s)],
        "list": latency_summary(status.list_s),
        "status_cli_wall": {**latency_summary(cli_probe.wall_s), "errors": cli_probe.errors[:5]} if cli_probe else None,
        "checks": checks,
    }


def _submits_done_at(submits: list[dict], started: float) -> float:
    return max((s["started"] + s.get("wall_s", 0.0) for s in submits), default=started)


def _submit_all(cluster: LoadCluster, files: list[Path], memory: PeakMemory) -> list[dict]:
    submits = []
    for path in files:
        log = cluster.work / "submits" / f"{path.stem}.err"
        log.parent.mkdir(exist_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", "submit", str(path)], env=cluster.env,
                                stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True)
        memory.watch(f"submit:{path.name}", proc)
        submits.append({"file": path.name, "proc": proc, "log": log, "started": time.time()})
    return submits


def _wait_final(cluster: LoadCluster, submits: list[dict], options: LoadOptions, started: float, progress) -> float | None:
    """Until every submit has exited and every job is final; returns when the last job ended (its own
    timestamp), or None on timeout."""
    last_note = 0.0
    while time.time() - started < options.timeout_s:
        for s in submits:
            if "wall_s" not in s and s["proc"].poll() is not None:
                s["wall_s"] = time.time() - s["started"]
        with cluster.ctx.sessions() as session:
            jobs = list(session.scalars(select(Job)))
        final = [j for j in jobs if j.status in JobStatus.TERMINAL]
        if all("wall_s" in s for s in submits) and len(final) == len(jobs):
            return max((t for t in map(end_time, final) if t is not None), default=time.time())
        if time.time() - last_note > 30:
            done = sum(j.completed + j.failed for j in jobs)
            progress(f"{time.time() - started:.0f} s: {len(final)}/{options.jobs} jobs final, "
                     f"{done}/{options.jobs * options.requests} requests done")
            last_note = time.time()
        time.sleep(0.5)
    return None


def _collect(submits: list[dict]) -> list[dict]:
    results = []
    for s in submits:
        proc = s["proc"]
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0] or ""
        results.append({"file": s["file"], "rc": proc.returncode, "wall_s": round(s.get("wall_s", 0.0), 2),
                        "job_id": out.strip()[-64:], "stderr": s["log"].read_text(errors="replace")[-2000:]})
    return results
