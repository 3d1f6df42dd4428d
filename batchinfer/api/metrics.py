"""GET /metrics (Prometheus): batches by status and by model, requests and tokens from SQL at scrape time, queue
depth, throughput and model per worker from the registry, and HTTP latency. For operators only: an admin key or
BATCHINFER_METRICS_TOKEN (api/guard.py)."""
from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchinfer.context import AppContext
from batchinfer.db.models import Job, ServiceOutage, UnitStatus, WorkUnit
from batchinfer.jobs.units.live import all_counts
from batchinfer.jobs.views.backlog import Backlog, model_backlogs
from batchinfer.jobs.faults import SERVICES
from batchinfer.jobs.outage import current
from batchinfer.cluster.registry import open_registry
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, model_queue


def _backlog_families(backlogs: dict[str, Backlog], configured) -> list[GaugeMetricFamily]:
    """The autoscaler's signals, per model (a configured model with nothing to do reads 0, so a rule scaling
    from zero sees a value, not an absent series): docs/fleet.md."""
    families = [GaugeMetricFamily("batchinfer_model_requests_pending", "Requests waiting for a worker of the model",
                                  labels=["model"]),
                GaugeMetricFamily("batchinfer_model_requests_running", "Requests running on the model's workers",
                                  labels=["model"]),
                GaugeMetricFamily("batchinfer_model_oldest_pending_seconds",
                                  "How long the model's oldest batch with a pending request has waited", labels=["model"])]
    for model in sorted({*backlogs, *configured}):
        b = backlogs.get(model, Backlog())
        for family, value in zip(families, (b.pending, b.running, round(b.oldest_pending_s, 3))):
            family.add_metric([model], value)
    return families


class _JobCollector:
    def __init__(self, ctx: AppContext):
        self.ctx = ctx

    def collect(self):
        with self.ctx.sessions() as session:
            by_model = session.execute(select(Job.model, Job.status, func.count()).group_by(Job.model, Job.status)).all()
            by_status: dict[str, int] = {}
            for _, status, count in by_model:
                by_status[status] = by_status.get(status, 0) + count
            counts = all_counts(session)  # committed, and what running units finished since their last commit
            backlogs = model_backlogs(session)
        batches = GaugeMetricFamily("batchinfer_batches", "Batches by status", labels=["status"])
        for status, count in by_status.items():
            batches.add_metric([str(status)], count)
        yield batches
        per_model = GaugeMetricFamily("batchinfer_model_batches", "Batches by model and status", labels=["model", "status"])
        for model, status, count in by_model:
            per_model.add_metric([model or "", str(status)], count)  # "": a batch still validating names none yet
        yield per_model
        requests = GaugeMetricFamily("batchinfer_requests", "Requests finished, by outcome", labels=["outcome"])
        requests.add_metric(["completed"], counts.completed)
        requests.add_metric(["failed"], counts.failed)
        yield requests
        tokens = GaugeMetricFamily("batchinfer_tokens", "Tokens of all batches, by kind", labels=["kind"])
        for kind, value in (("prompt", counts.prompt_tokens), ("cached", counts.cached_tokens),
                            ("completion", counts.completion_tokens)):
            tokens.add_metric([kind], value)
        yield tokens
        yield from _backlog_families(backlogs, self.ctx.settings.configured_models)
        yield from self._outages()
        yield from self._workers()

    def _outages(self):
        """Per service: down now, outages so far, unit runs released for it, seconds down; units waiting for it."""
        with self.ctx.sessions() as session:
            rows = {r.service: r for r in session.scalars(select(ServiceOutage))}
            waiting = dict(session.execute(select(WorkUnit.waiting_for, func.count()).where(
                WorkUnit.status == UnitStatus.QUEUED, WorkUnit.waiting_for.is_not(None)).group_by(WorkUnit.waiting_for)).all())
        down_now = current(self.ctx)
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
                    GaugeMetricFamily("batchinfer_service_down", "1 while the service is reported down", labels=["service"]),
                    CounterMetricFamily("batchinfer_outages", "Outages of the service seen so far", labels=["service"]),
                    CounterMetricFamily("batchinfer_outage_released_units", "Unit runs released unfinished for an outage "
                                        "(run again once the service answers; never failed)", labels=["service"]),
                    CounterMetricFamily("batchinfer_outage_seconds", "Seconds the service was down, over ended outages",
                                        labels=["service"]),
                    GaugeMetricFamily("batchinfer_units_waiting", "Units released and waiting for the service", labels=["service"])]
        for service in SERVICES:
            row = rows.get(service)
            values = (1 if service in down_now else 0, row.outages if row else 0, row.released_units if row else 0,
                      row.down_s if row else 0.0, waiting.get(service, 0))
            for family, value in zip(families, values):
                family.add_metric([service], value)
        yield from families

    def _workers(self):
        if self.ctx.settings.embedded:
            return
        try:
            registry = open_registry(self.ctx.settings)
            live = registry.live()
            depth = GaugeMetricFamily("batchinfer_queue_depth", "Messages waiting per queue (shared, worker, model)",
                                      labels=["queue"])
            depth.add_metric([SHARED_QUEUE], registry.queue_depth(SHARED_QUEUE))
            rate = GaugeMetricFamily("batchinfer_worker_tokens_per_second", "Measured prefill tokens/s per worker",
                                     labels=["worker"])
            info = GaugeMetricFamily("batchinfer_worker_model", "The model each live worker serves (always 1)",
                                     labels=["worker", "model"])
            for worker in live:
                depth.add_metric([worker.queue], registry.queue_depth(worker.queue))
                rate.add_metric([worker.name], worker.prefill_tokens_per_s or 0.0)
                info.add_metric([worker.name, worker.model], 1)
            for model in sorted({w.model for w in live if w.model}):
                depth.add_metric([model_queue(model)], registry.queue_depth(model_queue(model)))
        except Exception:  # Redis down: the job figures still come out
            return
        yield depth
        yield rate
        yield info


METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})  # any other: "other"


class _Timing:
    """HTTP latency by method, route template and status: labels from a closed set, whatever a client sends."""

    def __init__(self, app: ASGIApp, latency: Histogram):
        self.app, self.latency = app, latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            route = getattr(scope.get("route"), "path", None) or "other"  # a template of our own routes
            self.latency.labels(method, route, str(status[0])).observe(time.perf_counter() - started)


def install(app: FastAPI, ctx: AppContext) -> None:
    """GET /metrics; the guard lets through only an admin key or the metrics token."""
    registry = CollectorRegistry()
    registry.register(_JobCollector(ctx))
    latency = Histogram("batchinfer_http_request_duration_seconds", "HTTP request latency",
                        ["method", "route", "status"], registry=registry)
    app.add_middleware(_Timing, latency=latency)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
