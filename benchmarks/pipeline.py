"""`batchinfer bench pipeline`: one batch of N short chat requests through the real job system (PostgreSQL, Redis,
SeaweedFS S3, W `batchinfer worker` processes) with the null engine (BATCHINFER_ENGINE=null), so only the
pipeline is timed. Reports each phase (upload, validation, time to the first unit, units, finalize, download),
requests/s, the peak RSS of every process, and checks that each custom_id came back exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import func, select

from batchinfer.db.models import Job, JobStatus, WorkUnit

from .load_checks import end_time
from .load_cluster import LoadCluster
from .load_probes import PeakMemory
from .load_workload import custom_id, write_job_files


@dataclass
class PipelineOptions:
    requests: int = 10_000
    workers: int = 1
    system_prompts: int = 8
    postgres: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis: str = "start"
    storage: str = "s3"
    timeout_s: float = 1800.0
    keep: bool = False
    stream: bool = True  # BATCHINFER_STREAM_DISPATCH (the default): units start while the file is still validated
    unit_requests: int = 64  # BATCHINFER_MAX_REQUESTS_PER_UNIT: each unit pays ~2 transactions and 2 S3 calls
    unit_growth: int = 8  # BATCHINFER_UNIT_GROWTH (the default): a deep backlog's units hold up to this many times more
    line_bytes: int = 0  # > 0: each line padded to about this size (4000 x 50,000 lines: OpenAI's 200 MB file)

    def __post_init__(self):
        for name in ("requests", "workers", "system_prompts", "unit_requests", "unit_growth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def run_pipeline(options: PipelineOptions, work: Path, progress=print) -> dict:
    signal.signal(signal.SIGTERM, _interrupted)  # a `timeout` or kill still stops the services it started
    work.mkdir(parents=True, exist_ok=True)
    (path,) = write_job_files(work / "inputs", 1, options.requests, options.system_prompts, max_tokens=1,
                              line_bytes=options.line_bytes)
    progress(f"starting services and {options.workers} null-engine workers (work dir {work})")
    cluster = LoadCluster(work, options.postgres, options.redis, options.storage, options.keep)
    cluster.env["BATCHINFER_ENGINE"] = "null"  # the workers and the submit process; asked for by name
    cluster.env["BATCHINFER_STREAM_DISPATCH"] = "1" if options.stream else "0"
    cluster.env["BATCHINFER_MAX_REQUESTS_PER_UNIT"] = str(options.unit_requests)
    cluster.env["BATCHINFER_UNIT_GROWTH"] = str(options.unit_growth)
    try:
        names = cluster.start_workers(options.workers, threads=1)
        return _measure(options, cluster, names, path, progress)
    finally:
        cluster.close()


class PeakAndCpu(PeakMemory):
    """Peak RSS, and CPU seconds (user + system, from /proc) of each process: the figure that load from other
    processes on the machine changes least. A worker's CPU counts from its first reading after start-up."""

    def __init__(self, every: float = 0.1):
        super().__init__(every)
        self.cpu_first: dict[str, float] = {}
        self.cpu_last: dict[str, float] = {}

    def tick(self) -> None:
        super().tick()
        with self._lock:
            procs = dict(self.procs)
        for name, proc in procs.items():
            reading = _cpu_s(proc.pid) if proc.returncode is None else None
            if reading is not None and proc.poll() is None:
                self.cpu_first.setdefault(name, reading if name.startswith("worker:") else 0.0)
                self.cpu_last[name] = reading

    def cpu_used(self) -> dict[str, float]:
        return {name: round(last - self.cpu_first[name], 2) for name, last in sorted(self.cpu_last.items())}


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _measure(options: PipelineOptions, cluster: LoadCluster, names: list[str], path: Path, progress) -> dict:
    memory = PeakAndCpu(every=0.1)
    for name in names:
        memory.watch(f"worker:{name}", cluster.workers[name])
    memory.start()
    try:
        progress(f"submitting {options.requests} requests ({path.stat().st_size / 2**20:.1f} MiB)")
        submitted = _run(cluster, memory, "submit", [sys.executable, "-m", "benchmarks.pipeline_submit", str(path)])
        stamps = json.loads(submitted["stdout"].strip().splitlines()[-1])
        job = _wait_final(cluster, stamps["job_id"], options.timeout_s, progress)
        out, err = cluster.work / "output.jsonl", cluster.work / "errors.jsonl"
        downloaded = _run(cluster, memory, "download", [sys.executable, "-m", "batchinfer.cli", "download",
                                                        stamps["job_id"], "-o", str(out), "--errors", str(err)])
    finally:
        memory.stop()
    units = _unit_span(cluster, stamps["job_id"])
    return {"options": asdict(options), "workers": names, "input_mib": round(path.stat().st_size / 2**20, 1),
            "job": {"id": job.id, "status": job.status, "completed": job.completed, "failed": job.failed},
            "phases_s": _phases(stamps, job, units, downloaded["wall_s"]),
            "units": units["count"],
            "requests_per_s": round(options.requests / (end_time(job) - stamps["imported"]), 1),
            "peak_rss_mib": {name: round(kib / 1024, 1) for name, kib in sorted(memory.peak_kib.items())},
            "cpu_s": memory.cpu_used(), "load_average": os.getloadavg(),
            "checks": _check(out, err, options.requests, job)}


def _run(cluster: LoadCluster, memory: PeakMemory, name: str, command: list[str]) -> dict:
    started = time.time()
    proc = subprocess.Popen(command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory.watch(name, proc)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}): {stderr[-2000:]}")
    return {"stdout": stdout, "wall_s": time.time() - started}


def _wait_final(cluster: LoadCluster, job_id: str, timeout_s: float, progress) -> Job:
    started, noted = time.time(), time.time()
    while time.time() - started < timeout_s:
        with cluster.ctx.sessions() as session:
            job = session.get(Job, job_id)
        if job is not None and job.status in JobStatus.TERMINAL:
            return job
        if time.time() - noted > 15 and job is not None:
            progress(f"{time.time() - started:.0f} s: {job.status}, {job.completed + job.failed} requests done")
            noted = time.time()
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not final after {timeout_s:.0f} s")


def _unit_span(cluster: LoadCluster, job_id: str) -> dict:
    """One job in a fresh database: every unit is this job's."""
    with cluster.ctx.sessions() as session:
        count, first, last = session.execute(select(func.count(), func.min(WorkUnit.started_at),
                                                    func.max(WorkUnit.finished_at))).one()
    return {"count": count, "first_started": first, "last_finished": last}


def _phases(stamps: dict, job: Job, units: dict, download_s: float) -> dict:
    first, last = units["first_started"] or stamps["validated"], units["last_finished"] or stamps["validated"]
    phases = {
        "upload": stamps["uploaded"] - stamps["imported"],
        "validation": stamps["validated"] - stamps["uploaded"],
        "first_unit_after_upload": first - stamps["uploaded"],
        "units": last - first,
        "finalize": (end_time(job) or last) - (job.finalizing_at or last),
        "download": download_s,
        "end_to_end": (end_time(job) or last) - stamps["imported"],
    }
    return {k: round(v, 2) for k, v in phases.items()}


def _check(out: Path, err: Path, requests: int, job: Job) -> dict:
    ids = [json.loads(line)["custom_id"] for f in (out, err) if f.exists() for line in f.open("rb") if line.strip()]
    expected = {custom_id(0, i) for i in range(requests)}
    problems = []
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} custom_ids came back twice")
    if set(ids) != expected:
        problems.append(f"{len(expected - set(ids))} custom_ids missing, {len(set(ids) - expected)} unknown")
    if job.status != JobStatus.COMPLETED or job.completed != requests:
        problems.append(f"job {job.status} with {job.completed} completed, {job.failed} failed")
    return {"ok": not problems, "problems": problems, "lines": len(ids)}
