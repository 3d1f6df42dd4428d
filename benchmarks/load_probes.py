"""What the load bench watches while it runs: peak memory of its processes (their own VmHWM), and how long
`status` takes, asked the way `status --json` asks it (in this process) and as a `batchinfer status` process."""
from __future__ import annotations

import random
import statistics
import subprocess
import sys
import threading
import time

from batchinfer.jobs import service
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.jobs.views.reports import group_figures, unit_figures, units_json

from .process import hwm_kib


def latency_summary(seconds: list[float]) -> dict:
    if not seconds:
        return {"count": 0}
    ordered = sorted(seconds)
    return {"count": len(ordered), "p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1)}


def status_phases(at: list[float], seconds: list[float], submits_done_at: float) -> dict:
    """Status latency while the submits still run (every core validating) and after: where in the run a
    slow tail sits."""
    during = [s for t, s in zip(at, seconds) if t < submits_done_at]
    after = [s for t, s in zip(at, seconds) if t >= submits_done_at]
    return {"while_submits_run": latency_summary(during), "after_submits": latency_summary(after)}


class _Loop(threading.Thread):
    """A daemon thread that calls tick() every `every` seconds until stop()."""

    def __init__(self, every: float):
        super().__init__(daemon=True)
        self.every, self._stopped = every, threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            started = time.perf_counter()
            self.tick()
            self._stopped.wait(max(0.0, self.every - (time.perf_counter() - started)))

    def tick(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopped.set()
        self.join(60)


class PeakMemory(_Loop):
    """Largest VmHWM seen per process; a process that exits keeps its last reading (the high-water mark
    only rises, so at most the last interval's growth is missed). A reading counts only if its process had
    not been reaped by then: after that the pid may be another process's."""

    def __init__(self, every: float = 0.2):
        super().__init__(every)
        self.procs: dict[str, subprocess.Popen] = {}
        self.peak_kib: dict[str, int] = {}
        self._lock = threading.Lock()

    def watch(self, name: str, proc: subprocess.Popen) -> None:
        with self._lock:
            self.procs[name] = proc

    def tick(self) -> None:
        with self._lock:
            procs = dict(self.procs)
        for name, proc in procs.items():
            if proc.returncode is not None:
                continue
            reading = hwm_kib(proc.pid)
            if proc.poll() is None:
                self.peak_kib[name] = max(self.peak_kib.get(name, 0), reading)

    def peak_mib(self, prefix: str) -> dict:
        values = [kib / 1024 for name, kib in self.peak_kib.items() if name.startswith(prefix) and kib]
        if not values:
            return {"processes": 0}
        return {"processes": len(values), "max_mib": round(max(values), 1),
                "mean_mib": round(statistics.fmean(values), 1)}


def status_query(ctx, job_id: str) -> dict:
    """What `batchinfer status ID --json` reads: the job row, then its units' counts by prefix group."""
    job = service.get(ctx, job_id)
    units = unit_figures(ctx, job.id)
    return {**batch_object(job), "prefix_groups": [g.to_dict() for g in group_figures(units)], "units": units_json(units)}


class StatusProbe(_Loop):
    """One status query every `every` seconds, round-robin over the jobs, and a job list every few seconds
    (it is also how the probe learns the ids of jobs whose submit has not printed one yet)."""

    def __init__(self, ctx, jobs: int, every: float = 0.1, list_every: float = 2.0):
        super().__init__(every)
        self.ctx, self.jobs, self.list_every = ctx, jobs, list_every
        self.job_ids: list[str] = []
        self.status_s: list[float] = []
        self.status_at: list[float] = []  # when each status call started (time.time()), for the raw samples
        self.list_s: list[float] = []
        self.errors: list[str] = []
        self._next, self._listed_at = 0, 0.0

    def tick(self) -> None:
        try:
            if time.time() - self._listed_at >= self.list_every:
                started = time.perf_counter()
                found = service.list_jobs(self.ctx, limit=self.jobs)
                self.list_s.append(time.perf_counter() - started)
                self.job_ids, self._listed_at = sorted(j.id for j in found), time.time()
            if self.job_ids:
                job_id = self.job_ids[self._next % len(self.job_ids)]
                self._next += 1
                at, started = time.time(), time.perf_counter()
                status_query(self.ctx, job_id)
                self.status_s.append(time.perf_counter() - started)
                self.status_at.append(at)
        except Exception as exc:  # recorded and reported: a status that fails under load is a finding
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")


class CliStatusProbe(_Loop):
    """`batchinfer status ID --json` as a user runs it, every `every` seconds (process start-up included)."""

    def __init__(self, env: dict, job_ids, every: float = 30.0, timeout_s: float = 600.0):
        super().__init__(every)
        self.env, self.job_ids, self.timeout_s = env, job_ids, timeout_s
        self.wall_s: list[float] = []
        self.errors: list[str] = []

    def tick(self) -> None:
        ids = self.job_ids()
        if not ids:
            return
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "batchinfer.cli", "status", random.choice(ids), "--json"],
                                  env=self.env, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.wall_s.append(time.perf_counter() - started)
            self.errors.append(f"timed out after {self.timeout_s:.0f} s")
            return
        self.wall_s.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):  # 1: a failed job, which the checks report
            self.errors.append(done.stderr.strip()[-300:])
