"""The `batchinfer bench pipeline` command: run one batch through the job system on the null engine, write the raw
results as JSON, print a table."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .pipeline import PipelineOptions, run_pipeline
from .support.run_report import run_and_report


def bench_pipeline_command(
    requests: Annotated[int, typer.Option(help="requests in the one batch")] = 10_000,
    workers: Annotated[int, typer.Option(help="`batchinfer worker` processes, each on the null engine")] = 1,
    system_prompts: Annotated[int, typer.Option(help="distinct system prompts the requests share (1-8)")] = 8,
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL; a fresh database is created on it")] = PipelineOptions.postgres,
    redis: Annotated[str, typer.Option(help="start (a private redis-server) or a redis:// URL")] = "start",
    storage: Annotated[str, typer.Option(help="s3 (start SeaweedFS), local, or s3://bucket/prefix")] = "s3",
    timeout: Annotated[float, typer.Option(help="seconds before the run counts as stuck")] = 1800.0,
    work_dir: Annotated[Path | None, typer.Option(help="inputs, outputs and logs (default: a new temp dir)")] = None,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-pipeline.json"),
    keep: Annotated[bool, typer.Option(help="keep the database afterwards")] = False,
    stream: Annotated[bool, typer.Option(help="streaming dispatch (BATCHINFER_STREAM_DISPATCH, the default): units "
                                              "start while the file is still validated; --no-stream: after it")] = True,
    unit_requests: Annotated[int, typer.Option(help="requests a unit holds at most (BATCHINFER_MAX_REQUESTS_PER_UNIT)")] = 64,
    unit_growth: Annotated[int, typer.Option(help="a deep backlog's units hold up to this many times more "
                                                  "(BATCHINFER_UNIT_GROWTH; 1: never)")] = 8,
    line_bytes: Annotated[int, typer.Option(help="pad each line to about this many bytes (0: short lines; 4000 x "
                                                 "50,000 requests is a 200 MB file)", min=0)] = 0,
) -> None:
    """Pipeline: one batch of N requests through PostgreSQL, Redis, S3 and W null-engine workers; each phase timed."""
    try:
        options = PipelineOptions(requests, workers, system_prompts, postgres, redis, storage, timeout, keep, stream,
                                  unit_requests, unit_growth, line_bytes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    work = work_dir or Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    run_and_report(lambda: run_pipeline(options, work, progress=lambda line: typer.echo(line, err=True)), out, work, table)


def table(result: dict) -> Table:
    o, p = result["options"], result["phases_s"]
    grid = Table(title=f"bench-pipeline: {o['requests']} requests ({result['input_mib']} MiB), {o['workers']} "
                       f"null-engine workers, {result['units']} units", show_header=False)
    grid.add_column("figure", style="bold")
    grid.add_column("value")
    grid.add_row("checks", "ok" if result["checks"]["ok"] else "FAILED: " + "; ".join(result["checks"]["problems"]))
    for name, seconds in p.items():
        grid.add_row(name.replace("_", " "), f"{seconds:.2f} s")
    grid.add_row("throughput", f"{result['requests_per_s']:.0f} requests/s (upload start -> job completed)")
    for name, mib in result["peak_rss_mib"].items():
        grid.add_row(f"{name}", f"peak RSS {mib:.0f} MiB, CPU {result['cpu_s'].get(name, 0):.1f} s")
    grid.add_row("load average", " / ".join(f"{x:.1f}" for x in result["load_average"]) + " (1, 5, 15 min, at the end)")
    return grid
