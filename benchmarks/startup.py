"""Start-up, measured as a user meets it: `batchinfer run` of a one-request file, and a `batchinfer worker`
from spawn until its first unit is done. Per process: wall time, CPU time (user + sys) and peak RSS (VmHWM).

The model cache is warm (the caller's); the database is too: an untimed run (or `db upgrade`) makes it first.
first_run times the other case: each run on an empty model cache (issue 46's bound: within 10 s, writing at most
the model file's size), the kernels as the install left them.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .process import children, timed, tree_hwm_kib

ONE_REQUEST = ('{"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
               '"smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}], '
               '"max_tokens": 1, "temperature": 0}}\n')


# Where the timed run keeps its jobs is its own; engine settings (BATCHINFER_DTYPE, _DEVICE, _MODEL...) pass through.
SERVICE_SETTINGS = ("BATCHINFER_API_URL", "BATCHINFER_API_KEY", "BATCHINFER_BROKER_URL", "BATCHINFER_DATABASE_URL",
                    "BATCHINFER_STORAGE_URL", "BATCHINFER_DATA_DIR")


def clean_env(**extra: str) -> dict:
    """This environment without the service settings (the run gets its own data dir), the model cache kept."""
    from batchinfer.settings import get_settings

    env = {k: v for k, v in os.environ.items() if k not in SERVICE_SETTINGS}
    return env | {"BATCHINFER_MODEL_CACHE": str(get_settings().model_cache)} | extra


# `run` and `worker` as they start by default (the model loads in an engine process beside the CLI), and all in one
RUN_VARIANTS = {"two processes": {}, "one process": {"BATCHINFER_ENGINE_PROCESS": "0"}}


def run_start_up(work: Path, repeat: int, timeout_s: float = 600, variants: dict | None = None) -> list[dict]:
    """`batchinfer run` of one request (1 token out), `repeat` times after one untimed run; with variants (name ->
    extra environment), each variant in turn, so a load that comes and goes touches them alike."""
    requests, out = work / "one.jsonl", work / "results.jsonl"
    requests.write_text(ONE_REQUEST)
    env = clean_env(BATCHINFER_DATA_DIR=str((work / "data").resolve()))
    cmd = [sys.executable, "-m", "batchinfer.cli", "run", str(requests), "-o", str(out)]
    timed(cmd, env, timeout_s)  # makes the database, as a user's first run did
    variants = variants or {None: {}}
    return [_with_load(timed(cmd, env | extra, timeout_s)) | ({"variant": name} if name else {})
            for _ in range(repeat) for name, extra in variants.items()]


def first_run(work: Path, repeat: int, model: str | None = None, timeout_s: float = 600) -> list[dict]:
    """`batchinfer run` of one request on an empty model cache each time (`model`: a GGUF, else the default), after
    one untimed run on the warm cache (the database, and the file in the page cache as a download leaves it): wall,
    CPU, peak RSS, and the bytes the run left in its model cache beside the model file's size."""
    requests, out = work / "one.jsonl", work / "results.jsonl"
    requests.write_text(ONE_REQUEST)
    env = clean_env(BATCHINFER_DATA_DIR=str((work / "data").resolve()), **({"BATCHINFER_MODEL": model} if model else {}))
    cmd = [sys.executable, "-m", "batchinfer.cli", "run", str(requests), "-o", str(out)]
    timed(cmd, env, timeout_s)
    rows = []
    for i in range(repeat):
        cache = work / f"model-cache-{i}"
        row = _with_load(timed(cmd, env | {"BATCHINFER_MODEL_CACHE": str(cache)}, timeout_s))
        rows.append(row | {"cache_bytes": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())})
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def worker_start_up(work: Path, postgres: str, repeat: int, timeout_s: float = 600,
                    variants: dict | None = None) -> list[dict]:
    """A one-request job is queued first; then a worker starts, and the clock runs until the job is completed.
    With variants (name -> extra environment), each in turn, as run_start_up does."""
    from .load_cluster import LoadCluster

    cluster = LoadCluster(work, postgres, redis="start", storage="local")
    variants = variants or {None: {}}
    try:
        return [_with_load(_one_worker(cluster, work, i, timeout_s, extra)) | ({"variant": name} if name else {})
                for i in range(repeat) for name, extra in variants.items()]
    finally:
        cluster.close()


def _one_worker(cluster, work: Path, i: int, timeout_s: float, extra_env: dict | None = None) -> dict:
    from batchinfer.db.models import JobStatus
    from batchinfer.jobs import service
    from .support.services import start_cli, stop

    (work / "one.jsonl").write_text(ONE_REQUEST)
    submitted = subprocess.run([sys.executable, "-m", "batchinfer.cli", "submit", str(work / "one.jsonl")],
                               env=cluster.env, capture_output=True, text=True, timeout=timeout_s)
    if submitted.returncode != 0:
        return {"wall_s": None, "rc": submitted.returncode, "error": submitted.stderr[-600:]}
    job_id = submitted.stdout.strip().splitlines()[-1]
    start = time.time()
    proc = start_cli(cluster.env | (extra_env or {}), work / f"worker-{i}.log", "worker", "--name",
                     f"startup-{uuid.uuid4().hex[:6]}")
    try:
        peak, cpu = 0, 0.0
        while time.time() - start < timeout_s and proc.poll() is None:
            # its engine process too, where it forked one: peaks and CPU summed
            peak = max(peak, tree_hwm_kib(proc.pid))
            cpu = sum(_cpu_s(p) or 0.0 for p in [proc.pid, *children(proc.pid)]) or cpu
            if service.get(cluster.ctx, job_id).status == JobStatus.COMPLETED:
                return {"wall_s": round(time.time() - start, 3), "cpu_s": round(cpu, 3),
                        "max_rss_mib": round(peak / 1024, 1), "rc": 0}
            time.sleep(0.02)
        log = (work / f"worker-{i}.log").read_text(errors="replace")
        return {"wall_s": None, "rc": proc.poll(), "error": f"job not completed: {log[-600:]}"}
    finally:
        stop(proc)


def _cpu_s(pid: int) -> float | None:
    """user + sys seconds of a live process (and its waited-for children), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def _with_load(row: dict) -> dict:
    return row | {"load_1m": round(os.getloadavg()[0], 2)}


def summary(rows: list[dict]) -> dict:
    """Medians over the runs that finished."""
    ok = [r for r in rows if r.get("rc") == 0 and r.get("wall_s")]
    if not ok:
        return {"runs": len(rows), "ok": 0}
    keys = ("wall_s", "cpu_s", "max_rss_mib", "load_1m", *(("cache_bytes",) if "cache_bytes" in ok[0] else ()))
    return {"runs": len(rows), "ok": len(ok), **{f"median_{key}": round(statistics.median(r[key] for r in ok), 3)
                                                  for key in keys}}
