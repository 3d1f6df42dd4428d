"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

from typing import BinaryIO

from batchinfer.context import AppContext
from batchinfer.engine_host import tokenizer_and_context
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units
from batchinfer.validation import PreparedRequest, ValidationReport, validate_stream
from batchinfer.worker_registry import WorkerState


def preview(ctx: AppContext, source: BinaryIO, config: PlannerConfig, workers: list[WorkerState],
            default_tokens_per_s: float | None = None) -> tuple[PlanEstimate, ValidationReport]:
    """Validate (nothing stored), plan, and estimate on the known workers: their measured rate when
    they have one, else default_tokens_per_s each."""
    from batchinfer.service import _limits

    tokenizer, max_model_len = tokenizer_and_context(ctx.settings)
    pending: list[PendingRequest] = []

    def on_valid(req: PreparedRequest) -> None:
        pending.append(PendingRequest("dry-run", req.index, tuple(req.prompt_token_ids), req.sampling["max_tokens"]))

    report = validate_stream(source, tokenizer, _limits(ctx, max_model_len), on_valid, lambda _error: None)
    rates = [w.prefill_tokens_per_s or default_tokens_per_s for w in workers]
    rates = [r for r in rates if r]
    total_rate = sum(rates) if rates else None
    estimate = estimate_plan(pending, config, tokens_per_s=total_rate, workers=1 if total_rate else 0,
                             units=len(plan_units(pending, config)))
    estimate.workers = len(workers)
    return estimate, report
