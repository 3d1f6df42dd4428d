"""`batchinfer pause` and `resume`: hold a batch's new units back, and let it run again."""
from __future__ import annotations

import json

import typer

from batchinfer.cli.common import JSON_HELP, client, context, friendly_errors
from batchinfer.cli.submit import run_or_dispatch
from batchinfer.db.models import JobStatus
from batchinfer.jobs import service
from batchinfer.jobs.views.batch_view import batch_object


@friendly_errors
def pause(job_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)):
    """Pause a batch: no new unit of it starts, running ones finish, its completion window keeps running."""
    api = client()
    batch = api.pause(job_id) if api else batch_object(service.pause(context(), job_id))
    print(json.dumps(batch) if as_json else f"{batch['id']} {batch['status']}")


@friendly_errors
def resume(job_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar (without a broker it runs here)")):
    """Resume a paused batch: without a broker what it has left runs here, with one a dispatch is asked for."""
    api = client()
    if api:
        batch = api.resume(job_id)
    else:
        ctx = context()
        job = service.resume(ctx, job_id)
        if job.status in JobStatus.RUNNABLE:
            run_or_dispatch(ctx, job, quiet)
        batch = batch_object(service.get(ctx, job_id))
    print(json.dumps(batch) if as_json else f"{batch['id']} {batch['status']}")
