"""The `batchinfer bench startup` command: the start-up goal (1.5 s, under 1 GB) measured on this machine."""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from .process_command import _lscpu_model, _uptime
from .startup import RUN_VARIANTS, first_run, run_start_up, summary, worker_start_up

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def bench_startup_command(
    repeat: Annotated[int, typer.Option(min=1, help="timed runs of each (medians are reported)")] = 3,
    worker: Annotated[bool, typer.Option(help="also time a `batchinfer worker` up to its first unit done")] = True,
    compare: Annotated[bool, typer.Option(help="`run` and `worker` in two processes (the default) and in one, runs "
                                                "alternating")] = False,
    postgres: Annotated[str, typer.Option(help="PostgreSQL server for the worker case; a fresh database is made")] = POSTGRES,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-startup.json"),
    first: Annotated[bool, typer.Option("--first-run", help="only `run` on an empty model cache each time (the "
                                                              "bytes it writes there too)")] = False,
    model: Annotated[str | None, typer.Option("--model", help="a GGUF file (default: BATCHINFER_MODEL, else SmolLM2)")] = None,
) -> None:
    """Start-up: `batchinfer run` of one request (1 token out) and a worker's start to its first unit, each its own
    process: wall, CPU (user + sys) and peak RSS, with the load average beside each run."""
    report: dict = {"machine": {"cpu": _lscpu_model(), "cores": len(os.sched_getaffinity(0)), "load_before": _uptime(),
                                "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}}
    if model:
        report["model"] = {"path": str(Path(model).resolve()), "bytes": Path(model).stat().st_size}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        if first:
            typer.echo("batchinfer run, 1 request, on an empty model cache", err=True)
            report["first run"] = first_run(work, repeat, str(Path(model).resolve()) if model else None)
        else:
            typer.echo("batchinfer run, 1 request", err=True)
            (work / "run").mkdir()
            report["run"] = run_start_up(work / "run", repeat, variants=RUN_VARIANTS if compare else None)
        if worker and not first:
            typer.echo("batchinfer worker, to its first unit done", err=True)
            (work / "worker").mkdir()
            report["worker"] = worker_start_up(work / "worker", postgres, repeat,
                                               variants=RUN_VARIANTS if compare else None)
    for rows in (report.get("run"), report.get("worker"), report.get("first run")):
        for row in rows or []:
            row.pop("stdout", None)
    report["summary"] = {name: summary(report[name]) for name in ("run", "worker", "first run") if name in report}
    if compare:
        report["summary"] = {f"{what}, {name}": summary([r for r in report[what] if r["variant"] == name])
                             for what in ("run", "worker") if what in report for name in RUN_VARIANTS}
    report["machine"]["load_after"] = _uptime()
    out.write_text(json.dumps(report, indent=1))
    for name, figures in report["summary"].items():
        typer.echo(f"{name}: {_line(figures)}")
    typer.echo(f"load: {report['machine']['load_before']} -> {report['machine']['load_after']}; raw: {out}")


def _line(figures: dict) -> str:
    if not figures.get("ok"):
        return f"no run finished ({figures['runs']} tried)"
    written = f", {figures['median_cache_bytes']:,.0f} bytes written to the model cache" if "median_cache_bytes" in figures else ""
    return (f"{figures['median_wall_s']:.2f} s wall, {figures['median_cpu_s']:.2f} s CPU, "
            f"{figures['median_max_rss_mib']:.0f} MiB peak RSS{written} (median of {figures['ok']}, load "
            f"{figures['median_load_1m']})")


__all__ = ["bench_startup_command"]
