"""`batchinfer retry JOB`: a new batch of the job's lines that did not succeed; and the merged download."""
from __future__ import annotations

import json
from typing import BinaryIO

import typer

from batchinfer.cli.app import _client, _context, _dispatch_soon, _run_in_process, err, friendly_errors
from batchinfer.db.models import JobStatus
from batchinfer.jobs import service
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.views.batch_view import batch_object


@friendly_errors
def retry_command(job_id: str,
                  codes: list[str] = typer.Option([], "--code", help="only requests that failed with this error "
                                                  "code (batch_expired, batch_cancelled, server_error...), repeatable"),
                  completion_window: str | None = typer.Option(None, help="e.g. 24h (default: the setting)"),
                  as_json: bool = typer.Option(False, "--json", help="print the new job object as JSON")):
    """Retry a finished job's failed, expired and cancelled requests as a new job (metadata retry_of)."""
    client = _client()
    if client is not None:
        batch = client.retry(job_id, codes, completion_window)
        print(json.dumps(batch) if as_json else batch["id"])
        return
    from batchinfer.jobs.retry import create_retry

    ctx = _context()
    job = validate_job(ctx, create_retry(ctx, job_id, codes=set(codes) or None, completion_window=completion_window).id)
    if job.status == JobStatus.FAILED:
        err.print(f"job {job.id} (the retry) failed validation", markup=False, highlight=False)
    elif ctx.settings.embedded:
        _run_in_process(ctx, job, quiet=as_json)
    else:
        _dispatch_soon(job.id)
    job = service.get(ctx, job.id)
    print(json.dumps(batch_object(job)) if as_json else job.id)


def merged_fetch(job_id: str):
    """A fetch(target) for the download command: the job and its retries as one file."""
    client = _client()
    if client is not None:
        return lambda target: client.download_merged(client.get(job_id), target)
    from batchinfer.jobs.finalize.merged import merged_lines

    ctx = _context()

    def fetch(target: BinaryIO) -> bool:
        for raw in merged_lines(ctx, service.get(ctx, job_id)):
            target.write(raw)
        return True

    return fetch
