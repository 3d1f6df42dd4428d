"""`batchinfer bench api`: what a batch costs the API process: peak memory while a large upload streams
through it, and GET /v1/batches/{id} latency under concurrent pollers. The server runs as its own process."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LINE = json.dumps({"custom_id": "c{n}", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "x" * 900}]}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _write_file(path: Path, size_bytes: int) -> int:
    written, n = 0, 0
    with open(path, "w") as out:
        while written < size_bytes:
            line = LINE.replace("{n}", str(n)) + "\n"
            out.write(line)
            written, n = written + len(line), n + 1
    return n


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _upload(client, path: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    with open(path, "rb") as source:
        reply = client.post("/v1/files", files={"file": (path.name, source, "application/jsonl")},
                            data={"purpose": "batch"}, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - started, reply.json()


def _poll(client, batch_id: str, pollers: int, seconds: float) -> list[float]:
    deadline = time.time() + seconds

    def loop() -> list[float]:
        times = []
        while time.time() < deadline:
            started = time.perf_counter()
            client.get(f"/v1/batches/{batch_id}").raise_for_status()
            times.append(time.perf_counter() - started)
        return times

    with cf.ThreadPoolExecutor(pollers) as pool:
        return [t for chunk in pool.map(lambda _: loop(), range(pollers)) for t in chunk]


def bench_api_command(upload_mb: int = 200, pollers: int = 20, poll_seconds: float = 15.0,
                      out: str = "bench-results") -> None:
    """Server memory while a large file uploads, and GET latency under concurrent pollers (embedded setup)."""
    import httpx

    work = Path(tempfile.mkdtemp(prefix="bench-api-"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BATCHINFER_")},
           "BATCHINFER_DATA_DIR": str(work / "data"),
           "BATCHINFER_API_REQUESTS_PER_MIN": "1000000"}  # latency is measured here, not the per-key rate limit
    cli = [sys.executable, "-m", "batchinfer.cli"]
    key = json.loads(subprocess.run([*cli, "keys", "create", "--name", "bench", "--json"], env=env,
                                    capture_output=True, text=True, check=True).stdout)["key"]
    port = _free_port()
    server = subprocess.Popen([*cli, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"})
    try:
        for _ in range(100):
            try:
                client.get("/health")
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        idle_mib = _rss_mib(server.pid)
        big = work / "big.jsonl"
        lines = _write_file(big, upload_mb * 1_000_000)
        peak = [idle_mib]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak.append(_rss_mib(server.pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        upload_s, uploaded = _upload(client, big)
        done.set()
        sampler.join()
        upload_hwm = _rss_mib(server.pid, "VmHWM")  # before anything else can raise it
        small = work / "small.jsonl"
        small.write_text("{not json\n")  # fails validation at once: the poll measures the API, not the engine
        small_id = _upload(client, small)[1]["id"]
        batch = client.post("/v1/batches", json={"input_file_id": small_id, "endpoint": "/v1/chat/completions",
                                                 "completion_window": "24h"}).json()
        latencies = _poll(client, batch["id"], pollers, poll_seconds)
        result = {
            "machine": _machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": os.getloadavg(),
            "upload": {"bytes": uploaded["bytes"], "lines": lines, "seconds": round(upload_s, 2),
                       "mb_per_s": round(uploaded["bytes"] / 1e6 / upload_s, 1), "server_rss_idle_mib": round(idle_mib, 1),
                       "server_rss_peak_mib": round(max(peak), 1), "server_hwm_mib": round(upload_hwm, 1)},
            "poll": {"pollers": pollers, "requests": len(latencies), "per_s": round(len(latencies) / poll_seconds, 1),
                     "p50_ms": round(statistics.median(latencies) * 1000, 2),
                     "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
                     "max_ms": round(max(latencies) * 1000, 2)},
        }
    finally:
        server.terminate()
        server.wait(20)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "api.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def _machine() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"{os.cpu_count()} cores"
