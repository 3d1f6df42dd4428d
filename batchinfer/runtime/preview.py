"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

from typing import BinaryIO

from batchinfer.context import AppContext
from batchinfer.jobs import engine_rates
from batchinfer.jobs.tokenizer import tokenizer_and_context
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units
from batchinfer.planner.estimate import decode_steps
from batchinfer.jobs.job_validation import validation_limits
from batchinfer.jobs.validation import PreparedRequest, ValidationReport, validate_stream
from batchinfer.cluster.registry import WorkerState


def preview(ctx: AppContext, source: BinaryIO, config: PlannerConfig,
            workers: list[WorkerState]) -> tuple[PlanEstimate, ValidationReport]:
    """Validate (nothing stored), plan, and estimate on the known workers at the prefill and decode rates
    measured on their machines (engine_rates; the estimate says where the figure came from)."""
    tokenizer, max_model_len = tokenizer_and_context(ctx.settings)
    pending: list[PendingRequest] = []

    def on_valid(req: PreparedRequest) -> None:
        pending.append(req.to_pending("dry-run"))

    report = validate_stream(source, tokenizer, validation_limits(ctx.settings, max_model_len), on_valid, lambda _error: None)
    rate = engine_rates.measured(ctx, ctx.settings.model_id, [w.name for w in workers] + [engine_rates.machine_name()])
    units = plan_units(pending, config)
    decode = rate.decode_s(decode_steps(units), sum(r.max_tokens for r in pending))
    estimate = estimate_plan(pending, config, prefill_tokens_per_s=rate.prefill_tokens_per_s, decode_s=decode,
                             workers=len(workers), units=len(units))
    estimate.rate_source = rate.source
    return estimate, report


def estimate_key(estimate_id: str) -> str:
    return f"estimates/{estimate_id}.json"


def summary(ctx: AppContext, source: BinaryIO, workers: list[WorkerState]) -> dict:
    """The estimate of a file as `batchinfer plan --json` prints it and the API returns it."""
    from batchinfer.runtime.dispatch import planner_config

    estimate, report = preview(ctx, source, planner_config(ctx), workers)
    return {**estimate.to_dict(), "invalid_lines": report.lines - report.valid, "ok": report.ok,
            "errors": [e.to_dict() for e in report.errors]}


def estimate_file(ctx: AppContext, input_key: str, workers: list[WorkerState]) -> dict:
    with ctx.storage.open_read(input_key) as source:
        return summary(ctx, source, workers)


def store_estimate(ctx: AppContext, estimate_id: str, input_key: str, workers: list[WorkerState]) -> None:
    import io
    import json

    try:
        result = estimate_file(ctx, input_key, workers)
    except Exception as exc:  # the API reports it; the worker goes on
        result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    ctx.storage.upload(estimate_key(estimate_id), io.BytesIO(json.dumps(result).encode()))
