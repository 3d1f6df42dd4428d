"""Making batches: `submit`, `plan`, `run` and `retry`. Without a broker a batch runs in this process, with a
progress bar; with one, a dispatch is asked for and the command returns."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from batchinfer.cli.common import (DTYPE_HELP, EXIT_INVALID_INPUT, JSON_HELP, MODEL_HELP, client, context, err,
                                   force_dtype, force_model, friendly_errors, open_input, out, say)
from batchinfer.cli.progress import RunProgress
from batchinfer.cli.render import error_line, known_workers, plan_table
from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError, one_line, shown
from batchinfer.jobs import service
from batchinfer.jobs.intake.lines import first_named_model
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.retry import create_retry
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.planner import PlanEstimate
from batchinfer.runtime import engine_process
from batchinfer.runtime.embedded import run_pending
from batchinfer.runtime.preview import summary
from batchinfer.settings import get_settings

FILE_HELP = "OpenAI Batch JSONL input file"
SKIP_HELP = "run the valid lines; bad ones go to the error file"
STRICT_HELP = ("refuse the file if any line is bad, a request body the endpoint refuses too (nothing runs); without "
               "it such a request fails alone with its 400 and the rest run, as OpenAI's batches do")
SHOWN_LINES = 100  # bad lines listed before anything runs (then a count of the rest)


@friendly_errors
def submit(file: Path = typer.Argument(..., help=FILE_HELP),
           model: str | None = typer.Option(None, help="the batch's model id (default: the one its first line names)"),
           metadata: list[str] = typer.Option([], "--metadata", "-m", help="key=value, repeatable"),
           completion_window: str | None = typer.Option(None, help="e.g. 24h, 30m (default: the setting)"),
           skip_invalid: bool = typer.Option(False, help=SKIP_HELP),
           strict: bool = typer.Option(False, "--strict", help=STRICT_HELP),
           dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and its cost estimate; submit nothing"),
           as_json: bool = typer.Option(False, "--json", help=JSON_HELP)):
    """Submit a batch job; prints its id. Without a broker the job runs right here (the id first, a summary
    at the end). Every bad line is listed before anything runs."""
    api = client()
    if api is not None:
        _submit_remote(api, file, model, metadata, completion_window, skip_invalid, strict, dry_run, as_json)
        return
    ctx = context()
    if dry_run:
        _print_plan(ctx, file, as_json)
        return

    def created(job) -> None:  # the id at once: another shell can watch or cancel the job while it runs here
        if ctx.settings.embedded and not as_json:
            print(job.id, flush=True)

    with open_input(file) as source:
        job = service.submit(ctx, source, file.name, model, _parse_metadata(metadata), completion_window, skip_invalid,
                             on_created=created, on_rows=None if ctx.settings.embedded else _stream_dispatch,
                             strict=strict)
    if job.status == JobStatus.FAILED:
        _report_invalid(batch_object(job), as_json, service.bad_lines(ctx, job, SHOWN_LINES))
    if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        say(f"job {job.id} was cancelled while it validated: nothing of it runs")
    else:
        _report_refused(service.bad_lines(ctx, job, SHOWN_LINES), quiet=as_json)
        run_or_dispatch(ctx, job, quiet=as_json)
    job = service.get(ctx, job.id)
    if as_json:
        print(json.dumps(batch_object(job)))
    elif ctx.settings.embedded:
        _summary(job)
    else:
        print(job.id)


@friendly_errors
def plan(file: Path = typer.Argument(..., help=FILE_HELP),
         as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON for scripts")):
    """Requests, prompt tokens, prefix groups, expected cached tokens and run time, before anything runs."""
    api = client()
    if api is not None:
        if not file.is_file():
            raise BatchInferError(f"no such file: {file}")
        _print_estimate(api.plan(file), as_json)
        return
    _print_plan(context(), file, as_json)


@friendly_errors
def run(file: Path = typer.Argument(..., help=FILE_HELP),
        output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
        errors: Path | None = typer.Option(None, "--errors", help="where to write the error file"),
        skip_invalid: bool = typer.Option(False, help=SKIP_HELP),
        strict: bool = typer.Option(False, "--strict", help=STRICT_HELP),
        dtype: str | None = typer.Option(None, "--dtype", help=DTYPE_HELP),
        model: Path | None = typer.Option(None, "--model", help=MODEL_HELP),
        model_id: str | None = typer.Option(None, "--model-id", help="the name the lines use for --model (default: "
                                            "the model the first line names, else the folder's or file's name)")):
    """Validate, plan and run a file in this process (no services needed), then write the results."""
    force_dtype(dtype)
    if model is not None and model_id is None:
        model_id = _first_named_model(file)
    force_model(model, model_id)
    ctx = context(embedded=True)
    engine = engine_process.started()  # forked at start, importing torch since: the model loads while we validate
    if engine is not None:
        engine.load(ctx.settings)
    with open_input(file) as source:
        job = service.submit(ctx, source, file.name, skip_invalid=skip_invalid, strict=strict)
    if job.status == JobStatus.FAILED:
        _report_invalid(batch_object(job), False, service.bad_lines(ctx, job, SHOWN_LINES))
    _report_refused(service.bad_lines(ctx, job, SHOWN_LINES))
    _run_in_process(ctx, job)
    with open(output, "wb") as target:
        service.download(ctx, job.id, target)
    job = service.get(ctx, job.id)
    if errors is not None:
        with open(errors, "wb") as target:
            service.download(ctx, job.id, target, errors=True)
    _summary(job, output)
    if job.status != JobStatus.COMPLETED:
        raise typer.Exit(1)


@friendly_errors
def retry(job_id: str,
          codes: list[str] = typer.Option([], "--code", help="only requests that failed with this error code "
                                          "(batch_expired, batch_cancelled, server_error...), repeatable"),
          completion_window: str | None = typer.Option(None, help="e.g. 24h (default: the setting)"),
          as_json: bool = typer.Option(False, "--json", help="print the new job object as JSON")):
    """Retry a finished job's failed, expired and cancelled requests as a new job (metadata retry_of)."""
    api = client()
    if api is not None:
        batch = api.retry(job_id, codes, completion_window)
        print(json.dumps(batch) if as_json else batch["id"])
        return
    ctx = context()
    job = validate_job(ctx, create_retry(ctx, job_id, codes=set(codes) or None, completion_window=completion_window).id)
    if job.status == JobStatus.FAILED:
        say(f"job {job.id} (the retry) failed validation")
    else:
        run_or_dispatch(ctx, job, quiet=as_json)
    job = service.get(ctx, job.id)
    print(json.dumps(batch_object(job)) if as_json else job.id)


def _submit_remote(api, file: Path, model, metadata, completion_window, skip_invalid, strict, dry_run, as_json) -> None:
    if not file.is_file():
        raise BatchInferError(f"no such file: {file}")
    if dry_run:
        _print_estimate(api.plan(file), as_json)
        return
    batch = api.submit(file, _parse_metadata(metadata), completion_window, skip_invalid, strict)
    if batch["status"] == JobStatus.FAILED:
        _report_invalid(batch, as_json)
    print(json.dumps(batch) if as_json else batch["id"])


def _parse_metadata(pairs: list[str]) -> dict:
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BatchInferError(f"--metadata takes key=value, got {shown(pair)}")
        metadata[key] = value
    return metadata


def _print_plan(ctx, file: Path, as_json: bool) -> None:
    """What the file would cost on the known workers, before anything runs (nothing is stored)."""
    with open_input(file) as source:
        _print_estimate(summary(ctx, source, known_workers(ctx.settings)), as_json)


def _print_estimate(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for error in result["errors"]:
            say(f"error: {error_line(error)}")
        for error in result.get("request_errors", []):  # a body the endpoint refuses: that request fails alone
            say(f"refused: {error_line(error)} (this request fails alone; the rest run)")
        fields = PlanEstimate.__dataclass_fields__
        out.print(plan_table(PlanEstimate(**{k: v for k, v in result.items() if k in fields})))
    if result["requests"] == 0 or not result["ok"]:
        raise typer.Exit(EXIT_INVALID_INPUT)


def _report_invalid(batch: dict, as_json: bool, bad: tuple[list[dict], int] | None = None) -> None:
    """A batch that failed validation: every bad line (`bad`, where this process can read them: both the problems
    that failed it and the bodies refused alone), else its errors; exits 2."""
    if as_json:
        print(json.dumps(batch))
    else:
        errors = batch["errors"] or {"data": [], "count": 0}
        shown, count = bad if bad is not None else (errors["data"], errors.get("count", len(errors["data"])))
        for error in shown:
            say(f"error: {error_line(error)}")
        if count > len(shown):
            err.print(f"error: ... and {count - len(shown)} more")
        failing = errors.get("count", len(errors["data"]))
        say(f"job {batch['id']} failed validation: {failing} error(s), nothing ran")
    raise typer.Exit(EXIT_INVALID_INPUT)


def _report_refused(bad: tuple[list[dict], int], quiet: bool = False) -> None:
    """The bad lines of a batch that runs, before anything runs: bodies the endpoint refused (each fails alone with
    its 400) and, with --skip-invalid, the lines left out."""
    shown, count = bad
    if quiet or not count:
        return
    for error in shown:
        what = "refused" if error["fails_alone"] else "skipped"
        say(f"{what}: {error_line(error)}")
    if count > len(shown):
        say(f"... and {count - len(shown)} more")
    say(f"{count} bad line(s) go to the error file, each failing alone; the rest run (--strict refuses the file instead)")


def _first_named_model(file: Path) -> str | None:
    try:
        with open(file, "rb") as source:
            return first_named_model(source, get_settings().max_line_bytes)
    except OSError:  # the submit names the problem
        return None


def run_or_dispatch(ctx, job, quiet: bool) -> None:
    """Without a broker the batch runs here; with one, a dispatch is asked for."""
    if ctx.settings.embedded:
        _run_in_process(ctx, job, quiet)
    else:
        _dispatch_soon(job.id)


def _run_in_process(ctx, job, quiet: bool = False) -> None:
    """Generates in `run`'s engine process where it forked one (batchinfer/runtime/engine_process.py), else here."""
    with RunProgress(err, job.total - job.invalid, quiet, job.id) as progress:
        try:
            run_pending(ctx, on_result=progress.on_result, on_loaded=progress.loaded, load=engine_process.generator_for)
        except engine_process.EngineProcessLost as exc:
            raise BatchInferError(str(exc)) from None


def _summary(job, output: Path | None = None) -> None:
    """The last line of an in-process run, on stderr: how it ended (and where the results went)."""
    where = f" -> {output}" if output else ""
    say(f"{job.id} {job.status}: {job.completed} completed, {job.failed} failed{where}")


def _stream_dispatch() -> None:
    """A big file's first rows are committed (settings.stream_dispatch): its first units may start now."""
    from workers.tasks import stream_dispatch  # lazy: celery, which only the cluster mode needs

    stream_dispatch()


def _dispatch_soon(job_id: str) -> None:
    from kombu.exceptions import OperationalError  # lazy: kombu and celery, which only the cluster mode needs

    from workers.tasks import trigger_dispatch

    try:
        trigger_dispatch()
    except OperationalError as exc:  # the job is queued in the database: a worker's sweep dispatches it
        raise BatchInferError(f"job {job_id} is queued, but the broker is unreachable ({one_line(exc)}); "
                              "it is dispatched once the broker is back") from None
