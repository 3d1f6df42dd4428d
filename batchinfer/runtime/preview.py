"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

import io
import json
import logging
from typing import BinaryIO

from batchinfer.context import AppContext
from batchinfer.jobs import engine_rates
from batchinfer.jobs.views.eta import shape_of
from batchinfer.errors import one_line
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units, sized_for
from batchinfer.jobs.intake.validate_job import batch_model, checked_with
from batchinfer.jobs.intake.lines import ValidLine, peek_model, unserved_model_report, validate_stream
from batchinfer.jobs.records import ValidationReport
from batchinfer.jobs.served_models import served_models
from batchinfer.cluster.registry import WorkerState, open_registry
from batchinfer.jobs.dispatch.planning import planner_config

log = logging.getLogger(__name__)

def preview(ctx: AppContext, source: BinaryIO, config: PlannerConfig, workers: list[WorkerState],
            rate: engine_rates.MeasuredRate | None = None) -> tuple[PlanEstimate, ValidationReport]:
    """Validate (nothing stored), plan, and estimate on the known workers at the prefill and decode rates
    measured on their machines (engine_rates, unless `rate` is given; the estimate says where the figure came
    from)."""
    pending: list[PendingRequest] = []

    def on_valid(valid: ValidLine) -> None:
        pending.append(valid.request.to_pending("dry-run", base=model))

    named, source = peek_model(source, ctx.settings.max_line_bytes)
    model, served = batch_model(ctx, named), served_models(ctx)
    checked = checked_with(ctx, model, served)  # as validation would take it: that model's tokenizer and limits
    if checked is not None:
        report = validate_stream(source, *checked, on_valid, lambda _error: None)
    else:
        report = unserved_model_report(model, served)
    workers = [w for w in workers if w.model in ("", model)]
    if rate is None:
        rate = engine_rates.measured(ctx, model, [w.name for w in workers] + [engine_rates.machine_name()])
    units = plan_units(pending, sized_for(config, len(pending), len(workers)))
    estimate = estimate_plan(pending, config, workers=len(workers), units=len(units))
    if workers:  # priced as `status` prices a batch before its first request finishes (views.eta)
        estimate.estimated_run_s = shape_of(estimate, units, config.block_size).seconds(rate, len(workers))
    estimate.rate_source = rate.source
    return estimate, report


def worker_count(ctx: AppContext) -> int:
    """Workers a batch's units spread over: the live ones (1 if none is known), or this process when embedded."""
    if ctx.settings.embedded:
        return 1
    try:
        return max(1, len(open_registry(ctx.settings).live()))
    except Exception as exc:  # the broker is away: an ETA on one worker, an upper bound
        log.info("no worker count for the ETA: %s", one_line(exc))
        return 1


def estimate_key(estimate_id: str) -> str:
    return f"estimates/{estimate_id}.json"


def summary(ctx: AppContext, source: BinaryIO, workers: list[WorkerState],
            rate: engine_rates.MeasuredRate | None = None) -> dict:
    """The estimate of a file as `batchinfer plan --json` prints it and the API returns it."""
    estimate, report = preview(ctx, source, planner_config(ctx), workers, rate)
    return {**estimate.to_dict(), "invalid_lines": report.lines - report.valid, "ok": report.ok,
            "errors": [e.to_dict() for e in report.errors],  # each fails the batch
            "request_errors": [e.to_dict() for e in report.request_errors]}  # each fails its request alone


def estimate_file(ctx: AppContext, input_key: str, workers: list[WorkerState]) -> dict:
    with ctx.storage.open_read(input_key) as source:
        return summary(ctx, source, workers)


def _exists(ctx: AppContext, key: str) -> bool:
    try:
        return ctx.storage.exists(key)
    except Exception:  # storage down: not known to be gone
        return True


def store_estimate(ctx: AppContext, estimate_id: str, input_key: str, workers: list[WorkerState]) -> None:
    try:
        result = estimate_file(ctx, input_key, workers)
    except Exception as exc:  # the API reports it (no paths or class names: those stay in this log); the worker goes on
        gone = not _exists(ctx, input_key)
        log.log(logging.INFO if gone else logging.WARNING, "estimate %s failed: %s", estimate_id, one_line(exc))
        result = {"error": "the input file is gone (deleted while its estimate waited)" if gone
                  else "the estimate failed on the worker; its log has the cause"}
    ctx.storage.upload(estimate_key(estimate_id), io.BytesIO(json.dumps(result).encode()))
