"""The ASGI app: `create_app(settings)`; `batchinfer serve` runs it on uvicorn."""
from __future__ import annotations

import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from batchinfer.api import access_log, anthropic_batches, batches, dashboard, errors, files, metrics, retry
from batchinfer.api.auth import api_key
from batchinfer.api.guard import Guard
from batchinfer.api.work import WorkQueue
from batchinfer.cluster.registry import live_models_reader
from batchinfer.context import AppContext
from batchinfer.jobs.served_models import served_models
from batchinfer.jobs.views.backlog import Backlog, model_backlogs
from batchinfer.settings import Settings, get_settings

STATIC_DIR = Path(__file__).with_name("static")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    ctx = AppContext.create(settings)
    ctx.live_models = live_models_reader(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        plane = _control_plane(ctx)
        yield
        if plane is not None:
            plane.stop()
        app.state.work.close()

    docs = settings.api_docs  # off by default: the API's shape is OpenAI's, documented there and in README.md
    app = FastAPI(title="batchinfer", version="0.1.0", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url=None, openapi_url="/openapi.json" if docs else None)
    app.state.ctx, app.state.work = ctx, WorkQueue(ctx)
    errors.install(app)
    app.add_middleware(Guard, ctx=ctx)  # outside FastAPI: before any body is read
    metrics.install(app, ctx)  # its timing wraps the guard: refusals are counted too
    if settings.access_log:
        access_log.install(app)

    @app.get("/health", include_in_schema=False)
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(api_key)])
    def models() -> dict:
        return {"object": "list", "data": model_list(ctx)}

    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(dashboard.router)
    anthropic_batches.install(app)
    app.include_router(retry.router)
    if STATIC_DIR.is_dir():  # the dashboard, when present, answers everything the API does not
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="dashboard")
    return app


def _control_plane(ctx: AppContext):
    """Cluster mode: the sweep and webhook delivery run here too, so jobs end with no worker alive."""
    if ctx.settings.embedded or not ctx.settings.serve_control_plane:
        return None
    from batchinfer.runtime.control_plane import ControlPlane  # lazy: the cluster mode's
    from workers.tasks import SEND  # lazy: celery, which only the cluster mode needs

    return ControlPlane(ctx, SEND).start()


def model_list(ctx: AppContext) -> list[dict]:
    """OpenAI's model objects, plus ours: `live` (a live worker serves it now; None: the registry is unreachable,
    or there is no broker and this process runs what it serves) and `configured` (its tokenizer is known here)."""
    try:
        served, reachable = served_models(ctx), True
    except ConnectionError:
        served, reachable = served_models(replace(ctx, live_models=None)), False
    known = reachable and ctx.live_models is not None
    with ctx.sessions() as session:
        backlogs = model_backlogs(session)
    models = [{"id": m.id, "object": "model", "created": 0, "owned_by": "batchinfer",
               "live": m.live if known else None, "configured": m.configured,
               **_backlog(backlogs.get(m.id, Backlog()))} for m in served.values()]
    return models + adapter_list(ctx.settings.model_id, sorted(ctx.settings.adapters), models)


def _backlog(b: Backlog) -> dict:
    """Ours, for an autoscaler (docs/fleet.md): requests waiting for a worker of the model, running, and the age of
    the oldest batch waiting."""
    return {"pending_requests": b.pending, "running_requests": b.running, "oldest_pending_s": round(b.oldest_pending_s, 3)}


def adapter_list(base: str, adapters: list[str], models: list[dict]) -> list[dict]:
    """The LoRA adapters of the base model, as vLLM lists them, with `parent` and `root` naming the base (vLLM's
    root is the adapter's folder: a server's paths are not its tenants' business); live as their base is (the
    backlog counted is the base's: adapters' lines are the base's batches)."""
    found = next((m for m in models if m["id"] == base), None)
    if found is None:
        return []
    return [found | {"id": name, "parent": base, "root": base} for name in adapters]


def serve(host: str, port: int, settings: Settings | None = None) -> None:
    """Bind first, so the printed address is the real one (port 0 picks a free port), then run uvicorn."""
    import uvicorn  # lazy: uvicorn, when the server starts

    app = create_app(settings)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"batchinfer API listening on http://{shown}:{bound} (dashboard at /, Ctrl-C stops)", file=sys.stderr,
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
