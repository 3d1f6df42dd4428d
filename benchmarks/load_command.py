"""The `batchinfer bench load` command: run the load case, write the raw results as JSON, print a table."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .load import LoadOptions, run_load
from .support.run_report import run_and_report


def bench_load_command(
    jobs: Annotated[int, typer.Option(help="jobs, each submitted by its own `batchinfer submit` process")] = 50,
    requests: Annotated[int, typer.Option(help="requests per job")] = 1000,
    workers: Annotated[int, typer.Option(help="`batchinfer worker` processes")] = 2,
    max_tokens: Annotated[int, typer.Option(help="max_tokens of every request")] = 1,
    system_prompts: Annotated[int, typer.Option(help="distinct system prompts the requests share (1-8)")] = 4,
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL; a fresh database is created on it")] = LoadOptions.postgres,
    redis: Annotated[str, typer.Option(help="start (a private redis-server) or a redis:// URL")] = "start",
    storage: Annotated[str, typer.Option(help="s3 (start SeaweedFS), local, or s3://bucket/prefix")] = "s3",
    threads_per_worker: Annotated[int, typer.Option(help="intra-op threads per worker; 0: cores / workers")] = 0,
    cli_status_every: Annotated[float, typer.Option(help="seconds between `batchinfer status` processes; 0: none")] = 30.0,
    timeout: Annotated[float, typer.Option(help="seconds before the run counts as stuck")] = 7200.0,
    work_dir: Annotated[Path | None, typer.Option(help="inputs and logs (default: a new temp dir)")] = None,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-load.json"),
    keep: Annotated[bool, typer.Option(help="keep the database afterwards")] = False,
) -> None:
    """Load: J jobs x R requests submitted at once to N workers; nothing lost or duplicated, status under 200 ms."""
    try:
        options = LoadOptions(jobs, requests, workers, max_tokens, system_prompts, postgres, redis, storage,
                              threads_per_worker, cli_status_every_s=cli_status_every, timeout_s=timeout, keep=keep)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    work = work_dir or Path(tempfile.mkdtemp(prefix="bench-load-"))
    run_and_report(lambda: run_load(options, work, progress=lambda line: typer.echo(line, err=True)), out, work, table)


def table(result: dict) -> Table:
    o, t, s, c = result["options"], result["time_split"], result["status"], result["checks"]
    grid = Table(title=f"bench-load: {o['jobs']} jobs x {o['requests']} requests, {o['workers']} workers", show_header=False)
    grid.add_column("figure", style="bold")
    grid.add_column("value")
    peak = result["peak_rss"]
    rows = [
        ("checks", "ok" if c["ok"] else f"FAILED ({c['problem_count']} problems)"),
        ("jobs by status", ", ".join(f"{k} {v}" for k, v in c["by_status"].items())),
        ("lines", f"{c['output_lines']} output, {c['error_lines']} errors"),
        ("wall", f"{result['wall_s']:.1f} s (first submit started -> last job final)"),
        ("throughput", f"{result['requests_per_s']:.1f} requests/s"),
        ("engine", f"{t['engine_ms_per_request']:.2f} ms/request ({t['engine_s']:.1f} s in {t['units']} units)"),
        ("pipeline overhead", f"{t['overhead_ms_per_request']:.2f} ms/request (workers x wall - engine)"),
        ("  inside units", f"{t['in_unit_overhead_ms_per_request']:.2f} ms/request (unit spans - engine)"),
        ("  outside units", f"{t['outside_units_ms_per_request']:.2f} ms/request (workers x wall - unit spans)"),
        ("  after the first unit", f"{t['steady_overhead_ms_per_request']:.2f} ms/request (first unit started "
                                   f"{t['first_unit_after_s']:.0f} s after the first submit)"),
        ("peak RSS worker", f"{peak['worker'].get('max_mib', 0):.0f} MiB max of {peak['worker']['processes']}"),
        ("peak RSS submit", f"{peak['submit'].get('max_mib', 0):.0f} MiB max, {peak['submit'].get('mean_mib', 0):.0f} mean "
                            f"of {peak['submit']['processes']}"),
        ("submit wall", _latency(result["submit_wall_s"], "ms", 1000)),
        ("status latency", _latency(s, "ms") + f" (target < {s['target_ms']} ms)"),
        ("  while submits run", _latency(s["while_submits_run"], "ms")),
        ("  after the submits", _latency(s["after_submits"], "ms")),
        ("list latency", _latency(result["list"], "ms")),
    ]
    if result.get("status_cli_wall"):
        rows.append(("`batchinfer status` process", _latency(result["status_cli_wall"], "ms")))
    for name, value in rows:
        grid.add_row(name, value)
    return grid


def _latency(summary: dict, unit: str, scale: float = 1) -> str:
    if not summary.get("count"):
        return "-"
    if scale == 1:
        return f"p50 {summary['p50_ms']:.0f} / p99 {summary['p99_ms']:.0f} / max {summary['max_ms']:.0f} {unit} ({summary['count']})"
    return f"p50 {summary['p50_ms'] / scale:.1f} / max {summary['max_ms'] / scale:.1f} s ({summary['count']})"
