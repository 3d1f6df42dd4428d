"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

from typing import BinaryIO

from batchinfer.context import AppContext
from batchinfer.jobs.input.tokenizer import tokenizer_and_context
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units
from batchinfer.jobs.job_validation import validation_limits
from batchinfer.jobs.input.validation import PreparedRequest, ValidationReport, validate_stream
from batchinfer.cluster.registry import WorkerState

# A worker that has not run a unit yet has no measured rate: this CPU-scale figure stands in
# (SmolLM2-135M, one core, prefill-dominated work); workers publish their measured rate after each unit.
ASSUMED_TOKENS_PER_S = 300.0


def preview(ctx: AppContext, source: BinaryIO, config: PlannerConfig, workers: list[WorkerState],
            assumed_tokens_per_s: float = ASSUMED_TOKENS_PER_S) -> tuple[PlanEstimate, ValidationReport]:
    """Validate (nothing stored), plan, and estimate on the known workers: their measured rate when
    they have one, else assumed_tokens_per_s each."""
    tokenizer, max_model_len = tokenizer_and_context(ctx.settings)
    pending: list[PendingRequest] = []

    def on_valid(req: PreparedRequest) -> None:
        pending.append(req.to_pending("dry-run"))

    report = validate_stream(source, tokenizer, validation_limits(ctx.settings, max_model_len), on_valid, lambda _error: None)
    rate = sum(w.prefill_tokens_per_s or assumed_tokens_per_s for w in workers)
    estimate = estimate_plan(pending, config, tokens_per_s=rate or None, units=len(plan_units(pending, config)))
    estimate.workers = len(workers)
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
