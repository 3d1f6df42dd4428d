"""Running the services: `worker` (a Celery worker with its model), `serve` (the HTTP API) and `db upgrade`."""
from __future__ import annotations

from pathlib import Path

import typer

from batchinfer.cli.common import DTYPE_HELP, MODEL_HELP, MODEL_ID_HELP, context, force_dtype, force_model, friendly_errors, say
from batchinfer.db.session import upgrade
from batchinfer.errors import BatchInferError
from batchinfer.runtime import engine_process
from batchinfer.settings import get_settings

db_app = typer.Typer(no_args_is_help=True, help="Database schema.")


@friendly_errors
def worker(name: str | None = typer.Option(None, help="worker name (default: host name)"),
           queues: list[str] = typer.Option([], "--queues", "-Q", help="extra queues, repeatable or comma-separated"),
           loglevel: str = typer.Option("INFO"),
           dtype: str | None = typer.Option(None, "--dtype", help=DTYPE_HELP),
           model: Path | None = typer.Option(None, "--model", help=MODEL_HELP),
           model_id: str | None = typer.Option(None, "--model-id", help=MODEL_ID_HELP)):
    """Start a Celery worker: loads its model once and announces it; consumes the shared queue, its own queue
    and its model's queue."""
    force_dtype(dtype)
    force_model(model, model_id)
    if get_settings().broker_url is None:
        raise BatchInferError("BATCHINFER_BROKER_URL is not set (e.g. redis://localhost:6379/0)")
    if (engine := engine_process.started()) is not None:  # forked at start: the model loads while Celery starts
        engine.load(get_settings())
    from workers.main import start_worker  # lazy: celery, which no other command needs

    start_worker(name, [q for item in queues for q in item.split(",") if q], loglevel)


@friendly_errors
def serve(host: str = typer.Option("127.0.0.1", help="address to listen on"),
          port: int = typer.Option(8000, help="port to listen on (0: any free port)"),
          access_log: bool | None = typer.Option(None, "--access-log/--no-access-log",
                                                 help="a line per request on stderr (default: the setting)")):
    """Serve the HTTP API (OpenAI Files and Batches shapes) and the dashboard on uvicorn; prints the address."""
    from batchinfer.api.app import serve as run_server  # lazy: fastapi and uvicorn, which no other command needs

    settings = context().settings
    if access_log is not None:
        settings = settings.model_copy(update={"access_log": access_log})
    run_server(host, port, settings)


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(revision: str = typer.Argument("head")):
    """Apply the schema migrations."""
    url = get_settings().resolved_database_url
    upgrade(url, revision)
    say(f"database at {revision}: {url.split('@')[-1]}")
