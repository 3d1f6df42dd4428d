"""Runs each system over each workload (warm-up, then a measured run) and gathers the summaries."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

from .config import BenchOptions
from .memory import PeakRss, process_max_rss_mib
from .metrics import RunResult, summarize
from .runners import SystemUnavailable, make_runner
from .workloads import Workload, build


def build_workloads(options: BenchOptions, seed: int | None = None) -> list[Workload]:
    from transformers import AutoTokenizer

    from batchinfer.engine.loading.loader import model_files_dir
    tokenizer = AutoTokenizer.from_pretrained(model_files_dir(options.model_path, options.cache_dir))
    seed = options.seed if seed is None else seed
    return [build(name, tokenizer, options.requests, options.max_tokens, seed, options.shared_prefix_tokens)
            for name in options.workloads]


def _warmup_workload(workload: Workload, warm: Workload, requests: int) -> Workload:
    """Same shape on a different document, so the measured run starts with its own prefix uncached."""
    return dataclasses.replace(warm, name=f"{workload.name}-warmup", prompts=warm.prompts[:requests],
                               max_tokens=min(workload.max_tokens, 8))


def run_system(system: str, options: BenchOptions) -> dict:
    """Every workload on one system; returns plain data (it may cross a process boundary)."""
    try:
        runner = make_runner(system, options)
    except SystemUnavailable as exc:
        return {"system": system, "skipped": str(exc), "runs": []}
    runs = []
    warm_sets = build_workloads(options, seed=options.seed + 1000)
    for workload, warm in zip(build_workloads(options), warm_sets):
        runs.append(_measure(runner, workload, warm, options))
    runner.close()
    return {"system": system, "skipped": None, "runs": runs, "process_max_rss_mib": process_max_rss_mib()}


def _measure(runner, workload: Workload, warm: Workload, options: BenchOptions) -> dict:
    warmup_s = 0.0
    if options.warmup_requests:
        start = time.time()
        runner.run(_warmup_workload(workload, warm, options.warmup_requests))
        warmup_s = time.time() - start
    with PeakRss() as rss:
        start = time.time()
        records, phases = runner.run(workload)
        wall = time.time() - start
    result = RunResult(runner.name, workload.name, wall, records, phases, rss.peak_mib, warmup_s)
    return {"summary": summarize(result, options.peak_gflops), "requests": [r.to_dict() for r in records]}


def run_bench(options: BenchOptions, progress=None) -> dict:
    machine, workloads = machine_info(), build_workloads(options)
    systems = []
    for system in options.systems:
        if progress:
            progress(f"running {system} on {', '.join(options.workloads)}")
        systems.append(_run_isolated(system, options) if options.isolate else run_system(system, options))
    machine["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"machine": machine, "options": options.to_dict(), "command": _command_line(),
            "workloads": {w.name: w.stats() for w in workloads}, "systems": systems,
            "runs": [run["summary"] for s in systems for run in s["runs"]]}


def _run_isolated(system: str, options: BenchOptions) -> dict:
    """A fresh process per system: its peak memory is its own and no thread pools are shared."""
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_system, system, options).result()


def _command_line() -> str:
    program = "python -m benchmarks" if sys.argv[0].endswith("__main__.py") else os.path.basename(sys.argv[0])
    return " ".join([program, *sys.argv[1:]])


def machine_info() -> dict:
    import torch
    return {"cpu": _cpu_model(), "cores": _cores(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "llama_cpp": _version("llama_cpp_python"),
            "python": platform.python_version(), "git_commit": _git_commit(),
            "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
