"""`batchinfer`: a thin Typer layer that parses, calls the job service, and prints (a table, or --json)."""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from batchinfer.jobs import service
from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError
from batchinfer.cli.render import error_line, job_dict, job_table, jobs_table

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  help="Batch LLM inference: hand over a JSONL file of requests, get a JSONL file of results.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
out = Console()
err = Console(stderr=True, soft_wrap=True)
EXIT_INVALID_INPUT = 2


def friendly_errors(command):
    """Errors reach people as one line on stderr and a non-zero exit code, never as a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except BatchInferError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for people
            err.print(f"error: {type(exc).__name__}: {exc}".splitlines()[0], markup=False, highlight=False)
            raise typer.Exit(1)
    return wrapper


def _context(embedded: bool = False):
    from pydantic import ValidationError

    from batchinfer.context import AppContext
    from batchinfer.settings import get_settings

    try:
        settings = get_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BatchInferError(f"invalid setting: {first['msg']}") from None
    if embedded:
        settings = settings.model_copy(update={"broker_url": None})
    return AppContext.create(settings)


def _parse_metadata(pairs: list[str]) -> dict:
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BatchInferError(f"--metadata takes key=value, got {pair!r}")
        metadata[key] = value
    return metadata


def _print_groups(ctx, job, as_json: bool, show_job: bool = True) -> None:
    """The job (unless --watch already shows it), then progress and cache hit rate per prefix group;
    with --json, per work unit too."""
    from batchinfer.cli.render import groups_table
    from batchinfer.jobs.reports import group_figures, unit_figures, units_json

    units = unit_figures(ctx, job.id)
    groups = group_figures(units)
    if as_json:
        print(json.dumps({**job_dict(job), "prefix_groups": [g.to_dict() for g in groups], "units": units_json(units)}))
        return
    if show_job:
        out.print(job_table(job_dict(job)))
    if groups:
        out.print(groups_table(groups))


def _print_plan(ctx, file: Path, as_json: bool) -> None:
    """What the file would cost on the known workers, before anything runs (nothing is stored)."""
    from batchinfer.runtime.dispatch import planner_config
    from batchinfer.cli.render import known_workers, plan_table
    from batchinfer.runtime.preview import preview

    workers = known_workers(ctx.settings)
    with _open_input(file) as source:
        estimate, report = preview(ctx, source, planner_config(ctx), workers)
    if as_json:
        print(json.dumps({**estimate.to_dict(), "invalid_lines": report.lines - report.valid,
                          "errors": [e.to_dict() for e in report.errors]}))
    else:
        for error in report.errors:
            err.print(f"error: {error_line(error.to_dict())}", markup=False, highlight=False)
        out.print(plan_table(estimate))
    if report.valid == 0 or not report.ok:
        raise typer.Exit(EXIT_INVALID_INPUT)


def _report_invalid(job, as_json: bool) -> None:
    if as_json:
        print(json.dumps(job_dict(job)))
    else:
        for error in job.errors:
            err.print(f"error: {error_line(error)}", markup=False, highlight=False)
        if job.error_count > len(job.errors):
            err.print(f"error: ... and {job.error_count - len(job.errors)} more")
        err.print(f"job {job.id} failed validation: {job.error_count} error(s), nothing ran")
    raise typer.Exit(EXIT_INVALID_INPUT)


def _open_input(path: Path):
    if not path.is_file():
        raise BatchInferError(f"no such file: {path}")
    return open(path, "rb")


def _run_in_process(ctx, job, quiet: bool = False) -> None:
    from batchinfer.runtime.embedded import run_pending

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=quiet, transient=False) as progress:
        task = progress.add_task("loading model", total=job.total - job.invalid)
        run_pending(ctx, on_result=lambda _r: progress.advance(task),
                    on_loaded=lambda: progress.update(task, description="generating"))


@app.command()
@friendly_errors
def submit(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
           model: Optional[str] = typer.Option(None, help="model id (default: the served model)"),
           metadata: list[str] = typer.Option([], "--metadata", "-m", help="key=value, repeatable"),
           completion_window: Optional[str] = typer.Option(None, help="e.g. 24h, 30m (default: the setting)"),
           skip_invalid: bool = typer.Option(False, help="run the valid lines; bad ones go to the error file"),
           dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and its cost estimate; submit nothing"),
           as_json: bool = typer.Option(False, "--json", help="print the job object as JSON")):
    """Submit a batch job; prints its id. Without a broker the job runs right here."""
    ctx = _context()
    if dry_run:
        _print_plan(ctx, file, as_json)
        return
    with _open_input(file) as source:
        job = service.submit(ctx, source, file.name, model, _parse_metadata(metadata), completion_window, skip_invalid)
    if job.status == JobStatus.FAILED:
        _report_invalid(job, as_json)
    if ctx.settings.embedded:
        _run_in_process(ctx, job, quiet=as_json)
    else:
        from workers.tasks import trigger_dispatch

        trigger_dispatch()
    job = service.get(ctx, job.id)
    print(json.dumps(job_dict(job)) if as_json else job.id)


@app.command()
@friendly_errors
def plan(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
         as_json: bool = typer.Option(False, "--json")):
    """Requests, prompt tokens, prefix groups, expected cached tokens and run time, before anything runs."""
    _print_plan(_context(), file, as_json)


@app.command()
@friendly_errors
def status(job_id: str, watch: bool = typer.Option(False, help="refresh until the job ends"),
           as_json: bool = typer.Option(False, "--json")):
    """Lifecycle, request counts, tokens, cache hit rate, timestamps, errors, and progress by prefix group."""
    ctx = _context()
    job = _refresh(ctx, job_id)
    if watch and not as_json:
        with Live(_status_view(ctx, job), console=out, refresh_per_second=2) as live:
            while job.status not in JobStatus.TERMINAL:
                time.sleep(1)
                job = _refresh(ctx, job_id)
                live.update(_status_view(ctx, job))
    else:
        while watch and job.status not in JobStatus.TERMINAL:
            time.sleep(1)
            job = _refresh(ctx, job_id)
        if as_json:
            _print_groups(ctx, job, as_json=True)
        else:
            out.print(_status_view(ctx, job))
    if job.status == JobStatus.FAILED:
        raise typer.Exit(1)


def _status_view(ctx, job):
    from rich.console import Group

    from batchinfer.cli.render import groups_table
    from batchinfer.jobs.reports import group_figures, unit_figures

    groups = group_figures(unit_figures(ctx, job.id)) if job.queued_at else []
    return Group(job_table(job_dict(job)), groups_table(groups)) if groups else job_table(job_dict(job))


def _refresh(ctx, job_id: str):
    service.expire_overdue(ctx)
    return service.get(ctx, job_id)


@app.command("list")
@friendly_errors
def list_(limit: int = typer.Option(50, min=1), as_json: bool = typer.Option(False, "--json")):
    """The most recent jobs."""
    views = [job_dict(j) for j in service.list_jobs(_context(), limit)]
    if as_json:
        print(json.dumps(views))
    else:
        out.print(jobs_table(views))


@app.command()
@friendly_errors
def cancel(job_id: str, as_json: bool = typer.Option(False, "--json")):
    """Cancel a job; everything finished so far is kept."""
    job = service.cancel(_context(), job_id)
    print(json.dumps(job_dict(job)) if as_json else f"{job.id} {job.status}")


@app.command()
@friendly_errors
def download(job_id: str, output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
             errors: Optional[Path] = typer.Option(None, "--errors", help="where to write the error file")):
    """Download a finished job's results (and errors)."""
    ctx = _context()
    with open(output, "wb") as target:
        if not service.download(ctx, job_id, target):
            raise BatchInferError(f"job {job_id} has no output file")
    if errors is not None:
        with open(errors, "wb") as target:
            service.download(ctx, job_id, target, errors=True)
    err.print(f"wrote {output}" + (f" and {errors}" if errors else ""))


@app.command()
@friendly_errors
def run(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
        output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
        errors: Optional[Path] = typer.Option(None, "--errors", help="where to write the error file"),
        skip_invalid: bool = typer.Option(False, help="run the valid lines; bad ones go to the error file")):
    """Validate, plan and run a file in this process (no services needed), then write the results."""
    ctx = _context(embedded=True)
    with _open_input(file) as source:
        job = service.submit(ctx, source, file.name, skip_invalid=skip_invalid)
    if job.status == JobStatus.FAILED:
        _report_invalid(job, as_json=False)
    _run_in_process(ctx, job)
    with open(output, "wb") as target:
        service.download(ctx, job.id, target)
    job = service.get(ctx, job.id)
    if errors is not None:
        with open(errors, "wb") as target:
            service.download(ctx, job.id, target, errors=True)
    err.print(f"{job.id} {job.status}: {job.completed} completed, {job.failed} failed -> {output}")
    if job.status != JobStatus.COMPLETED:
        raise typer.Exit(1)


@app.command()
@friendly_errors
def worker(name: Optional[str] = typer.Option(None, help="worker name (default: host name)"),
           queues: list[str] = typer.Option([], "--queues", "-Q", help="extra queues, repeatable or comma-separated"),
           loglevel: str = typer.Option("INFO")):
    """Start a Celery worker: loads the model once, consumes the shared queue and its own queue."""
    from batchinfer.settings import get_settings
    from workers.main import start_worker

    if get_settings().broker_url is None:
        raise BatchInferError("BATCHINFER_BROKER_URL is not set (e.g. redis://localhost:6379/0)")
    extra = [q for item in queues for q in item.split(",") if q]
    start_worker(name, extra, loglevel)


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(revision: str = typer.Argument("head")):
    """Apply the schema migrations."""
    from batchinfer.db.session import upgrade
    from batchinfer.settings import get_settings

    url = get_settings().resolved_database_url
    upgrade(url, revision)
    err.print(f"database at {revision}: {url.split('@')[-1]}")


from batchinfer.bench.command import bench  # noqa: E402  (registered here so the CLI stays one list of commands)
from batchinfer.bench.grouping import bench_grouping_command  # noqa: E402
from batchinfer.bench.process_command import bench_process_command  # noqa: E402

app.command("bench")(bench)
app.command("bench-grouping")(bench_grouping_command)
app.command("bench-process")(bench_process_command)


def main() -> None:
    app()

