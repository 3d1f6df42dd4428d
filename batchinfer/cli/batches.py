"""Following and collecting batches: `status` (once, or --watch), `list`, `cancel` and `download`."""
from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import typer
from rich.console import Group
from rich.live import Live

from batchinfer.cli.common import JSON_HELP, client, context, friendly_errors, out, say
from batchinfer.cli.progress import changed, watch_line
from batchinfer.cli.render import groups_table, groups_table_of, job_table, jobs_table
from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError
from batchinfer.jobs import service
from batchinfer.jobs.dispatch.planning import planner_config
from batchinfer.jobs.finalize.merged import merged_lines
from batchinfer.jobs.units.live import with_live
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.jobs.views.eta import batch_with_eta
from batchinfer.jobs.views.reports import group_figures, unit_figures, units_json
from batchinfer.runtime.preview import worker_count

WATCH_S = 0.5  # live counts move at most once a second: polling twice as often shows each change


@friendly_errors
def status(job_id: str,
           watch: bool = typer.Option(False, help="refresh until the job ends (not a terminal: a line per change)"),
           as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ", with its prefix groups and units")):
    """Lifecycle, request counts (live while units run), tokens, cache hit rate, ETA, timestamps, errors, and
    progress by prefix group."""
    api = client()
    if api is not None:
        _status_remote(api, job_id, watch, as_json)
        return
    ctx = context()
    job = _refresh(ctx, job_id)
    if watch and not as_json and not out.is_terminal:
        job = _watch_lines(lambda: _refresh(ctx, job_id), lambda j: _batch(ctx, j))
    elif watch and not as_json:
        with Live(_status_view(ctx, job), console=out, refresh_per_second=2) as live:
            while job.status not in JobStatus.TERMINAL:
                time.sleep(WATCH_S)
                job = _refresh(ctx, job_id)
                live.update(_status_view(ctx, job))
    else:
        while watch and job.status not in JobStatus.TERMINAL:
            time.sleep(1)
            job = _refresh(ctx, job_id)
        if as_json:
            units = unit_figures(ctx, job.id)  # with --json, per work unit too
            print(json.dumps({**_batch(ctx, job), "prefix_groups": [g.to_dict() for g in group_figures(units)],
                              "units": units_json(units)}))
        else:
            out.print(_status_view(ctx, job))
    if job.status == JobStatus.FAILED:
        raise typer.Exit(1)


@friendly_errors
def list_(limit: int = typer.Option(50, min=1, help="how many jobs, newest first"),
          all_: bool = typer.Option(False, "--all", help="through the API with an admin key: every tenant's jobs"),
          as_json: bool = typer.Option(False, "--json", help="print a JSON list of Batch objects for scripts")):
    """The most recent jobs (ids whole on one line, also at 80 columns)."""
    api = client()
    if api:
        views = api.list(limit, all_)
    else:
        ctx = context()
        views = [batch_object(j) for j in with_live(ctx, service.list_jobs(ctx, limit))]
    if as_json:
        print(json.dumps(views))
    else:
        out.print(jobs_table(views, out.width))


@friendly_errors
def cancel(job_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)):
    """Cancel a job: its running requests stop within a second; everything finished so far is kept."""
    api = client()
    batch = api.cancel(job_id) if api else batch_object(service.cancel(context(), job_id))
    print(json.dumps(batch) if as_json else f"{batch['id']} {batch['status']}")


@friendly_errors
def download(job_id: str, output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
             errors: Path | None = typer.Option(None, "--errors", help="where to write the error file"),
             merged: bool = typer.Option(False, "--merged", help="the job and its retries as one file: each "
                                         "custom_id once, the latest success winning")):
    """Download a finished job's results (and errors)."""
    api = client()
    if merged:
        fetch = _merged_fetch(api, job_id)
    elif api is not None:
        fetch = functools.partial(api.download, api.get(job_id))
    else:
        fetch = functools.partial(service.download, context(), job_id)
    has_output = _write_atomically(output, fetch)
    if errors is not None and not _write_atomically(errors, functools.partial(fetch, errors=True)):
        errors.unlink(missing_ok=True)
        errors.touch()  # asked for: an empty error file says there were no errors
    if not has_output:  # a job that failed validation: nothing ran, its bad lines are its error file
        hint = f"; wrote its error file to {errors}" if errors is not None else "; --errors FILE writes its error file"
        raise BatchInferError(f"job {job_id} has no output file{hint}")
    say(f"wrote {output}" + (f" and {errors}" if errors else ""))


def _watch_lines(fetch, view=batch_object):
    """`status --watch` into a pipe or a file: one line per change, until the job ends; returns the last."""
    shown = None
    while True:
        job = fetch()
        batch = view(job) if not isinstance(job, dict) else job
        if changed(shown, batch):
            print(watch_line(batch), flush=True)
            shown = batch
        if batch["status"] in JobStatus.TERMINAL:
            return job
        time.sleep(WATCH_S)


def _status_remote(api, job_id: str, watch: bool, as_json: bool) -> None:
    batch = api.get(job_id)
    if watch and not as_json and not out.is_terminal:
        batch = _watch_lines(lambda: api.get(job_id))
    while watch and batch["status"] not in JobStatus.TERMINAL:
        time.sleep(WATCH_S)
        batch = api.get(job_id)
    groups = api.prefix_groups(job_id)
    if as_json:
        print(json.dumps({**batch, "prefix_groups": groups}))
    else:
        out.print(Group(job_table(batch), groups_table_of(groups)) if groups else job_table(batch))
    if batch["status"] == JobStatus.FAILED:
        raise typer.Exit(1)


def _status_view(ctx, job):
    groups = group_figures(unit_figures(ctx, job.id)) if job.queued_at else []
    table = job_table(_batch(ctx, job))
    return Group(table, groups_table(groups)) if groups else table


def _batch(ctx, job) -> dict:
    """The Batch object; before the job's first request finishes, with the plan's ETA (jobs.views.eta)."""
    return batch_with_eta(ctx, job, planner_config(ctx), worker_count(ctx))


def _refresh(ctx, job_id: str):
    """The job with its running units' live counts (expiry and the rest are the sweep's: workers, or `run`)."""
    return with_live(ctx, [service.get(ctx, job_id)])[0]


def _merged_fetch(api, job_id: str):
    """A fetch(target) for download --merged: the job and its retries as one file."""
    if api is not None:
        return lambda target: api.download_merged(api.get(job_id), target)
    ctx = context()

    def fetch(target: BinaryIO) -> bool:
        for raw in merged_lines(ctx, service.get(ctx, job_id)):
            target.write(raw)
        return True

    return fetch


def _write_atomically(path: Path, fetch) -> bool:
    """Write through a temporary file beside `path`, renamed at the end: an existing file is never
    truncated by a download that fails or finds nothing."""
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as target:
            found = fetch(target)
        if found:
            os.replace(tmp, path)
        return found
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
