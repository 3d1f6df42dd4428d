"""`batchinfer`: a thin Typer layer that parses, calls the job service, and prints (a table, or --json)."""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live

from batchinfer.cli.bench_command import bench_command
from batchinfer.cli.render import error_line, job_table, jobs_table
from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError, excerpt, one_line, shown
from batchinfer.jobs import service
from batchinfer.jobs.views.batch_view import batch_object

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None,
                  help="Batch LLM inference: hand over a JSONL file of requests, get a JSONL file of results.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
keys_app = typer.Typer(no_args_is_help=True, help="API keys for `batchinfer serve` (one per tenant).")
app.add_typer(keys_app, name="keys")
# No emoji codes: ':smile:' in a custom_id or a file name prints as typed (markup is off per call, or Text).
out = Console(emoji=False)
JSON_HELP = "print JSON (the Batch object, as the API returns it) for scripts"
err = Console(stderr=True, soft_wrap=True, emoji=False)
EXIT_INVALID_INPUT = 2


def friendly_errors(command):
    """Errors reach people as one line on stderr and a non-zero exit code, never as a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            try:
                return command(*args, **kwargs)
            finally:
                sys.stdout.flush()  # a reader that went away (`| head`) shows here, not in a warning at exit
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            out.on_broken_pipe()  # as rich does for its own output: stdout to /dev/null, exit 1, no message
        except BatchInferError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            err.print(f"interrupted: {exc}" if str(exc) else "interrupted", markup=False, highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence for people
            if _database_down(exc):
                err.print("error: waiting for the database: it does not answer; batches resume by themselves once it "
                          "is back (nothing fails for it)", markup=False, highlight=False)
                raise typer.Exit(1) from None
            err.print(excerpt(f"error: {type(exc).__name__}: {exc}".splitlines()[0]), markup=False, highlight=False)
            raise typer.Exit(1) from None
    return wrapper


def _database_down(exc: BaseException) -> bool:
    from batchinfer.db.session import is_transient_db

    return is_transient_db(exc)


def _context(embedded: bool = False):
    from pydantic import ValidationError

    from batchinfer.context import AppContext
    from batchinfer.settings import get_settings

    try:
        settings = get_settings()
    except ValidationError as exc:
        raise _invalid_setting(exc) from None
    from batchinfer.cluster.registry import live_models_reader

    if embedded:
        settings = settings.model_copy(update={"broker_url": None})
    ctx = AppContext.create(settings)
    ctx.live_models = live_models_reader(settings)  # None in the embedded mode
    return ctx


def _invalid_setting(exc) -> BatchInferError:
    return BatchInferError(f"invalid setting: {exc.errors()[0]['msg']}")


def _set_command_line(**values) -> None:
    from pydantic import ValidationError

    from batchinfer.settings import set_command_line

    try:
        set_command_line(**values)
    except ValidationError as exc:
        raise _invalid_setting(exc) from None


DTYPE_HELP = "engine dtype: auto (float32 unless another is invariant, faithful and faster here), float32 or bfloat16"


def _force_dtype(dtype: str | None) -> None:
    """--dtype wins over BATCHINFER_DTYPE, for everything this process runs."""
    if dtype is None:
        return
    _set_command_line(dtype=dtype)


MODEL_HELP = "checkpoint to serve: a Hugging Face folder or a .gguf file (default: BATCHINFER_MODEL, else SmolLM2)"
MODEL_ID_HELP = "the name batches use for --model (default: the folder's or file's name)"


def _force_model(model: Path | None, model_id: str | None, fallback_id: str | None = None) -> None:
    """--model / --model-id win over BATCHINFER_MODEL / BATCHINFER_MODEL_ID, for everything this process runs.
    The id of a --model without --model-id: fallback_id, else its folder's or file's name."""
    if model is None and model_id is None:
        return
    from batchinfer.settings import check_model_id

    chosen: dict[str, str] = {}
    if model is not None:
        if not model.exists():
            raise BatchInferError(f"--model: no file or folder {shown(str(model))}")
        chosen["model"] = str(model.resolve())
        model_id = model_id or fallback_id or model.stem
    if model_id is not None:
        try:
            chosen["model_id"] = check_model_id(model_id, "--model-id")
        except ValueError as exc:
            raise BatchInferError(str(exc)) from None
    _set_command_line(**chosen)


def _client():
    """The API client when BATCHINFER_API_URL is set (the CLI then talks HTTP only), else None."""
    from batchinfer.settings import get_settings

    settings = get_settings()
    if not settings.api_url:
        return None
    from batchinfer.cli.client import ApiClient

    return ApiClient(settings.api_url, settings.api_key, submit_wait_s=settings.api_submit_wait_s)


def _parse_metadata(pairs: list[str]) -> dict:
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BatchInferError(f"--metadata takes key=value, got {shown(pair)}")
        metadata[key] = value
    return metadata


def _print_groups(ctx, job, as_json: bool, show_job: bool = True) -> None:
    """The job (unless --watch already shows it), then progress and cache hit rate per prefix group;
    with --json, per work unit too."""
    from batchinfer.cli.render import groups_table
    from batchinfer.jobs.views.reports import group_figures, unit_figures, units_json

    units = unit_figures(ctx, job.id)
    groups = group_figures(units)
    if as_json:
        print(json.dumps({**_batch(ctx, job), "prefix_groups": [g.to_dict() for g in groups], "units": units_json(units)}))
        return
    if show_job:
        out.print(job_table(_batch(ctx, job)))
    if groups:
        out.print(groups_table(groups))


def _print_plan(ctx, file: Path, as_json: bool) -> None:
    """What the file would cost on the known workers, before anything runs (nothing is stored)."""
    from batchinfer.cli.render import known_workers
    from batchinfer.runtime.preview import summary

    with _open_input(file) as source:
        _print_estimate(summary(ctx, source, known_workers(ctx.settings)), as_json)


def _report_invalid(job, as_json: bool) -> None:
    _report_invalid_batch(batch_object(job), as_json)


def _report_invalid_batch(batch: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(batch))
    else:
        errors = batch["errors"] or {"data": [], "count": 0}
        for error in errors["data"]:
            err.print(f"error: {error_line(error)}", markup=False, highlight=False)
        count = errors.get("count", len(errors["data"]))
        if count > len(errors["data"]):
            err.print(f"error: ... and {count - len(errors['data'])} more")
        err.print(f"job {batch['id']} failed validation: {count} error(s), nothing ran", markup=False, highlight=False)
    raise typer.Exit(EXIT_INVALID_INPUT)


def _first_named_model(file: Path) -> str | None:
    from batchinfer.jobs.intake.lines import first_named_model
    from batchinfer.settings import get_settings

    try:
        with open(file, "rb") as source:
            return first_named_model(source, get_settings().max_line_bytes)
    except OSError:  # the submit names the problem
        return None


def _open_input(path: Path):
    if not path.is_file():
        raise BatchInferError(f"no such file: {path}")
    return open(path, "rb")


def _run_in_process(ctx, job, quiet: bool = False) -> None:
    """Generates in `run`'s engine process where it forked one (batchinfer/runtime/engine_process.py), else here."""
    from batchinfer.cli.progress import RunProgress
    from batchinfer.runtime.embedded import run_pending
    from batchinfer.runtime.engine_process import EngineProcessLost, generator_for

    with RunProgress(err, job.total - job.invalid, quiet, job.id) as progress:
        try:
            run_pending(ctx, on_result=progress.on_result, on_loaded=progress.loaded, load=generator_for)
        except EngineProcessLost as exc:
            raise BatchInferError(str(exc)) from None


def _summary(job, output: Path | None = None) -> None:
    """The last line of an in-process run, on stderr: how it ended (and where the results went)."""
    where = f" -> {output}" if output else ""
    err.print(f"{job.id} {job.status}: {job.completed} completed, {job.failed} failed{where}", markup=False,
              highlight=False)


@app.command()
@friendly_errors
def submit(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
           model: str | None = typer.Option(None, help="the batch's model id (default: the one its first line names)"),
           metadata: list[str] = typer.Option([], "--metadata", "-m", help="key=value, repeatable"),
           completion_window: str | None = typer.Option(None, help="e.g. 24h, 30m (default: the setting)"),
           skip_invalid: bool = typer.Option(False, help="run the valid lines; bad ones go to the error file"),
           dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and its cost estimate; submit nothing"),
           as_json: bool = typer.Option(False, "--json", help=JSON_HELP)):
    """Submit a batch job; prints its id. Without a broker the job runs right here (the id first, a summary
    at the end)."""
    client = _client()
    if client is not None:
        _submit_remote(client, file, model, metadata, completion_window, skip_invalid, dry_run, as_json)
        return
    ctx = _context()
    if dry_run:
        _print_plan(ctx, file, as_json)
        return
    def created(job) -> None:  # the id at once: another shell can watch or cancel the job while it runs here
        if ctx.settings.embedded and not as_json:
            print(job.id, flush=True)

    with _open_input(file) as source:
        job = service.submit(ctx, source, file.name, model, _parse_metadata(metadata), completion_window, skip_invalid,
                             on_created=created, on_rows=None if ctx.settings.embedded else _stream_dispatch)
    if job.status == JobStatus.FAILED:
        _report_invalid(job, as_json)
    if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        err.print(f"job {job.id} was cancelled while it validated: nothing of it runs", markup=False, highlight=False)
    elif ctx.settings.embedded:
        _run_in_process(ctx, job, quiet=as_json)
    else:
        _dispatch_soon(job.id)
    job = service.get(ctx, job.id)
    if as_json:
        print(json.dumps(batch_object(job)))
    elif ctx.settings.embedded:
        _summary(job)
    else:
        print(job.id)


def _stream_dispatch() -> None:
    """A big file's first rows are committed (settings.stream_dispatch): its first units may start now."""
    from workers.tasks import stream_dispatch

    stream_dispatch()


def _dispatch_soon(job_id: str) -> None:
    from kombu.exceptions import OperationalError

    from workers.tasks import trigger_dispatch

    try:
        trigger_dispatch()
    except OperationalError as exc:  # the job is queued in the database: a worker's sweep dispatches it
        raise BatchInferError(f"job {job_id} is queued, but the broker is unreachable ({one_line(exc)}); "
                              "it is dispatched once the broker is back") from None


def _submit_remote(client, file: Path, model, metadata, completion_window, skip_invalid, dry_run, as_json) -> None:
    if not file.is_file():
        raise BatchInferError(f"no such file: {file}")
    if dry_run:
        _print_estimate(client.plan(file), as_json)
        return
    batch = client.submit(file, _parse_metadata(metadata), completion_window, skip_invalid)
    if batch["status"] == JobStatus.FAILED:
        _report_invalid_batch(batch, as_json)
    print(json.dumps(batch) if as_json else batch["id"])


def _print_estimate(result: dict, as_json: bool) -> None:
    from batchinfer.cli.render import plan_table
    from batchinfer.planner import PlanEstimate

    if as_json:
        print(json.dumps(result))
    else:
        for error in result["errors"]:
            err.print(f"error: {error_line(error)}", markup=False, highlight=False)
        fields = PlanEstimate.__dataclass_fields__
        out.print(plan_table(PlanEstimate(**{k: v for k, v in result.items() if k in fields})))
    if result["requests"] == 0 or not result["ok"]:
        raise typer.Exit(EXIT_INVALID_INPUT)


@app.command()
@friendly_errors
def plan(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
         as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON for scripts")):
    """Requests, prompt tokens, prefix groups, expected cached tokens and run time, before anything runs."""
    client = _client()
    if client is not None:
        if not file.is_file():
            raise BatchInferError(f"no such file: {file}")
        _print_estimate(client.plan(file), as_json)
        return
    _print_plan(_context(), file, as_json)


@app.command()
@friendly_errors
def status(job_id: str,
           watch: bool = typer.Option(False, help="refresh until the job ends (not a terminal: a line per change)"),
           as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ", with its prefix groups and units")):
    """Lifecycle, request counts (live while units run), tokens, cache hit rate, ETA, timestamps, errors, and
    progress by prefix group."""
    client = _client()
    if client is not None:
        _status_remote(client, job_id, watch, as_json)
        return
    ctx = _context()
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
            _print_groups(ctx, job, as_json=True)
        else:
            out.print(_status_view(ctx, job))
    if job.status == JobStatus.FAILED:
        raise typer.Exit(1)


WATCH_S = 0.5  # live counts move at most once a second: polling twice as often shows each change


def _watch_lines(fetch, view=batch_object):
    """`status --watch` into a pipe or a file: one line per change, until the job ends; returns the last."""
    from batchinfer.cli.progress import changed, watch_line

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


def _status_remote(client, job_id: str, watch: bool, as_json: bool) -> None:
    from rich.console import Group

    from batchinfer.cli.render import groups_table_of

    batch = client.get(job_id)
    if watch and not as_json and not out.is_terminal:
        batch = _watch_lines(lambda: client.get(job_id))
    while watch and batch["status"] not in JobStatus.TERMINAL:
        time.sleep(WATCH_S)
        batch = client.get(job_id)
    groups = client.prefix_groups(job_id)
    if as_json:
        print(json.dumps({**batch, "prefix_groups": groups}))
    else:
        out.print(Group(job_table(batch), groups_table_of(groups)) if groups else job_table(batch))
    if batch["status"] == JobStatus.FAILED:
        raise typer.Exit(1)


def _status_view(ctx, job):
    from rich.console import Group

    from batchinfer.cli.render import groups_table
    from batchinfer.jobs.views.reports import group_figures, unit_figures

    groups = group_figures(unit_figures(ctx, job.id)) if job.queued_at else []
    table = job_table(_batch(ctx, job))
    return Group(table, groups_table(groups)) if groups else table


def _batch(ctx, job) -> dict:
    """The Batch object; before the job's first request finishes, with the plan's ETA (jobs.views.eta)."""
    from batchinfer.jobs.views.eta import batch_with_eta
    from batchinfer.jobs.dispatch.planning import planner_config
    from batchinfer.runtime.preview import worker_count

    return batch_with_eta(ctx, job, planner_config(ctx), worker_count(ctx))


def _refresh(ctx, job_id: str):
    """The job with its running units' live counts (expiry and the rest are the sweep's: workers, or `run`)."""
    from batchinfer.jobs.units.live import with_live

    return with_live(ctx, [service.get(ctx, job_id)])[0]


@app.command("list")
@friendly_errors
def list_(limit: int = typer.Option(50, min=1, help="how many jobs, newest first"),
          all_: bool = typer.Option(False, "--all", help="through the API with an admin key: every tenant's jobs"),
          as_json: bool = typer.Option(False, "--json", help="print a JSON list of Batch objects for scripts")):
    """The most recent jobs (ids whole on one line, also at 80 columns)."""
    client = _client()
    if client:
        views = client.list(limit, all_)
    else:
        from batchinfer.jobs.units.live import with_live

        ctx = _context()
        views = [batch_object(j) for j in with_live(ctx, service.list_jobs(ctx, limit))]
    if as_json:
        print(json.dumps(views))
    else:
        out.print(jobs_table(views, out.width))


@app.command()
@friendly_errors
def cancel(job_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)):
    """Cancel a job: its running requests stop within a second; everything finished so far is kept."""
    client = _client()
    batch = client.cancel(job_id) if client else batch_object(service.cancel(_context(), job_id))
    print(json.dumps(batch) if as_json else f"{batch['id']} {batch['status']}")


@app.command()
@friendly_errors
def download(job_id: str, output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
             errors: Path | None = typer.Option(None, "--errors", help="where to write the error file"),
             merged: bool = typer.Option(False, "--merged", help="the job and its retries as one file: each "
                                         "custom_id once, the latest success winning")):
    """Download a finished job's results (and errors)."""
    client = _client()
    if merged:
        from batchinfer.cli.retry_command import merged_fetch

        fetch = merged_fetch(job_id)
    elif client is not None:
        batch = client.get(job_id)
        fetch = functools.partial(client.download, batch)
    else:
        ctx = _context()
        fetch = functools.partial(service.download, ctx, job_id)
    has_output = _write_atomically(output, fetch)
    if errors is not None and not _write_atomically(errors, functools.partial(fetch, errors=True)):
        errors.unlink(missing_ok=True)
        errors.touch()  # asked for: an empty error file says there were no errors
    if not has_output:  # a job that failed validation: nothing ran, its bad lines are its error file
        hint = f"; wrote its error file to {errors}" if errors is not None else "; --errors FILE writes its error file"
        raise BatchInferError(f"job {job_id} has no output file{hint}")
    err.print(f"wrote {output}" + (f" and {errors}" if errors else ""), markup=False, highlight=False)


def _write_atomically(path: Path, fetch) -> bool:
    """Write through a temporary file beside `path`, renamed at the end: an existing file is never
    truncated by a download that fails or finds nothing."""
    import tempfile

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


@app.command()
@friendly_errors
def run(file: Path = typer.Argument(..., help="OpenAI Batch JSONL input file"),
        output: Path = typer.Option(..., "-o", "--output", help="where to write the results"),
        errors: Path | None = typer.Option(None, "--errors", help="where to write the error file"),
        skip_invalid: bool = typer.Option(False, help="run the valid lines; bad ones go to the error file"),
        dtype: str | None = typer.Option(None, "--dtype", help=DTYPE_HELP),
        model: Path | None = typer.Option(None, "--model", help=MODEL_HELP),
        model_id: str | None = typer.Option(None, "--model-id", help="the name the lines use for --model (default: "
                                            "the model the first line names, else the folder's or file's name)")):
    """Validate, plan and run a file in this process (no services needed), then write the results."""
    _force_dtype(dtype)
    if model is not None and model_id is None:
        model_id = _first_named_model(file)
    _force_model(model, model_id)
    ctx = _context(embedded=True)
    from batchinfer.runtime.engine_process import started

    engine = started()  # forked at start, importing torch since: the model loads while we validate
    if engine is not None:
        engine.load(ctx.settings)
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
    _summary(job, output)
    if job.status != JobStatus.COMPLETED:
        raise typer.Exit(1)


@app.command()
@friendly_errors
def worker(name: str | None = typer.Option(None, help="worker name (default: host name)"),
           queues: list[str] = typer.Option([], "--queues", "-Q", help="extra queues, repeatable or comma-separated"),
           loglevel: str = typer.Option("INFO"),
           dtype: str | None = typer.Option(None, "--dtype", help=DTYPE_HELP),
           model: Path | None = typer.Option(None, "--model", help=MODEL_HELP),
           model_id: str | None = typer.Option(None, "--model-id", help=MODEL_ID_HELP)):
    """Start a Celery worker: loads its model once and announces it; consumes the shared queue, its own queue
    and its model's queue."""
    from batchinfer.runtime.engine_process import started
    from batchinfer.settings import get_settings
    from workers.main import start_worker

    _force_dtype(dtype)
    _force_model(model, model_id)
    if get_settings().broker_url is None:
        raise BatchInferError("BATCHINFER_BROKER_URL is not set (e.g. redis://localhost:6379/0)")
    if (engine := started()) is not None:  # forked at start, importing torch since: the model loads while Celery starts
        engine.load(get_settings())
    extra = [q for item in queues for q in item.split(",") if q]
    start_worker(name, extra, loglevel)


@app.command()
@friendly_errors
def serve(host: str = typer.Option("127.0.0.1", help="address to listen on"),
          port: int = typer.Option(8000, help="port to listen on (0: any free port)"),
          access_log: bool | None = typer.Option(None, "--access-log/--no-access-log",
                                                 help="a line per request on stderr (default: the setting)")):
    """Serve the HTTP API (OpenAI Files and Batches shapes) and the dashboard on uvicorn; prints the address."""
    from batchinfer.api.app import serve as run_server

    settings = _context().settings
    if access_log is not None:
        settings = settings.model_copy(update={"access_log": access_log})
    run_server(host, port, settings)


@keys_app.command("create")
@friendly_errors
def keys_create(name: str = typer.Option(..., help="who the key is for"),
                webhook: str | None = typer.Option(None, "--webhook", help="URL that receives batch.* events"),
                admin: bool = typer.Option(False, "--admin", help="sees every batch and the workers"),
                org: str | None = typer.Option(None, "--org", help="share the prefix cache with this org's keys"),
                as_json: bool = typer.Option(False, "--json", help="print the key (with its secret) as JSON")):
    """Make an API key; its secret (and its webhook signing secret) is printed once and never shown again."""
    from batchinfer.jobs.tenancy import tenants

    key, secret = tenants.create_key(_context(), name, webhook_url=webhook, admin=admin, org=org)
    if as_json:
        record = {"id": key.id, "name": key.name, "key": secret, "admin": key.is_admin, "org": key.org}
        if key.webhook_url:
            record |= {"webhook_url": key.webhook_url, "webhook_secret": key.webhook_secret}
        print(json.dumps(record))
    else:
        print(secret)
        if key.webhook_secret:
            print(key.webhook_secret)
        printed = ("the key above and its webhook signing secret below it are" if key.webhook_secret
                   else "the key above is")
        err.print(f"created {key.id} ({key.name}{', admin' if admin else ''}); {printed} shown only now",
                  markup=False, highlight=False)


@keys_app.command("list")
@friendly_errors
def keys_list(as_json: bool = typer.Option(False, "--json", help="print a JSON list for scripts")):
    """The API keys (never their secrets)."""
    from batchinfer.cli.render import keys_table
    from batchinfer.jobs.tenancy import tenants

    rows = [{"id": k.id, "name": k.name, "org": k.org, "created_at": int(k.created_at),
             "revoked_at": int(k.revoked_at) if k.revoked_at else None} for k in tenants.list_keys(_context())]
    if as_json:
        print(json.dumps(rows))
    else:
        out.print(keys_table(rows))


@keys_app.command("revoke")
@friendly_errors
def keys_revoke(key_id: str):
    """Revoke an API key: it gets 401 from then on."""
    from batchinfer.jobs.tenancy import tenants

    key = tenants.revoke_key(_context(), key_id)
    print(f"{key.id} revoked")


@keys_app.command("set-org")
@friendly_errors
def keys_set_org(key_id: str, org: str | None = typer.Argument(None, help="the org; leave out for the key's own scope")):
    """Put a key in an org: keys of one org share the prefix cache and cross-batch prefix groups. Batches
    the key creates from then on run in the org's scope; without ORG the key gets its own scope back."""
    from batchinfer.jobs.tenancy import tenants

    key = tenants.set_org(_context(), key_id, org)
    print(f"{key.id} is in org {key.org}" if key.org else f"{key.id} has its own cache scope")


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(revision: str = typer.Argument("head")):
    """Apply the schema migrations."""
    from batchinfer.db.session import upgrade
    from batchinfer.settings import get_settings

    url = get_settings().resolved_database_url
    upgrade(url, revision)
    err.print(f"database at {revision}: {url.split('@')[-1]}", markup=False, highlight=False)


# The retry command registers last: it imports this module's app.
from batchinfer.cli.retry_command import retry_command  # noqa: E402

app.command("bench", add_help_option=False,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench_command)
app.command("retry")(retry_command)


def main() -> None:
    app()

