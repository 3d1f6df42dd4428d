"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

from typing import BinaryIO

from batchinfer.context import AppContext
from batchinfer.jobs.tokenizer import tokenizer_and_context
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units
from batchinfer.jobs.service import validation_limits
from batchinfer.jobs.validation import PreparedRequest, ValidationReport, validate_stream
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
        pending.append(PendingRequest("dry-run", req.index, tuple(req.prompt_token_ids), req.sampling["max_tokens"]))

    report = validate_stream(source, tokenizer, validation_limits(ctx.settings, max_model_len), on_valid, lambda _error: None)
    rate = sum(w.prefill_tokens_per_s or assumed_tokens_per_s for w in workers)
    estimate = estimate_plan(pending, config, tokens_per_s=rate or None, units=len(plan_units(pending, config)))
    estimate.workers = len(workers)
    return estimate, report
