"""`batchinfer plan FILE` / `submit --dry-run`: what a file would cost, before anything runs."""
from __future__ import annotations

from typing import BinaryIO

from rich.table import Table

from batchinfer.context import AppContext
from batchinfer.engine_host import tokenizer_and_context
from batchinfer.planner import PendingRequest, PlanEstimate, PlannerConfig, estimate_plan, plan_units
from batchinfer.settings import Settings
from batchinfer.validation import PreparedRequest, ValidationReport, validate_stream
from batchinfer.worker_registry import WorkerState

# A worker that has not run a unit yet has no measured rate: this CPU-scale figure stands in
# (SmolLM2-135M, one core, prefill-dominated work); workers publish their measured rate after each unit.
ASSUMED_TOKENS_PER_S = 300.0


def known_workers(settings: Settings) -> list[WorkerState]:
    """The live workers with their measured rates; in embedded mode, this process."""
    if settings.embedded:
        return [WorkerState("embedded")]
    from workers.registry import worker_registry

    return worker_registry(settings).live()


def preview(ctx: AppContext, source: BinaryIO, config: PlannerConfig, workers: list[WorkerState],
            assumed_tokens_per_s: float = ASSUMED_TOKENS_PER_S) -> tuple[PlanEstimate, ValidationReport]:
    """Validate (nothing stored), plan, and estimate on the known workers: their measured rate when
    they have one, else assumed_tokens_per_s each."""
    from batchinfer.service import _limits

    tokenizer, max_model_len = tokenizer_and_context(ctx.settings)
    pending: list[PendingRequest] = []

    def on_valid(req: PreparedRequest) -> None:
        pending.append(PendingRequest("dry-run", req.index, tuple(req.prompt_token_ids), req.sampling["max_tokens"]))

    report = validate_stream(source, tokenizer, _limits(ctx, max_model_len), on_valid, lambda _error: None)
    rate = sum(w.prefill_tokens_per_s or assumed_tokens_per_s for w in workers)
    estimate = estimate_plan(pending, config, tokens_per_s=rate or None, units=len(plan_units(pending, config)))
    estimate.workers = len(workers)
    return estimate, report


def plan_table(est: PlanEstimate) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("requests", str(est.requests))
    table.add_row("prompt tokens", str(est.prompt_tokens))
    table.add_row("max new tokens", str(est.max_new_tokens))
    table.add_row("prefix groups", str(est.prefix_groups))
    table.add_row("expected cached tokens", f"{est.expected_cached_tokens} ({est.expected_hit_rate:.1%} of prompt tokens)")
    table.add_row("work units", str(est.units))
    run = f"{est.estimated_run_s:.0f} s" if est.estimated_run_s is not None else "unknown"
    table.add_row("estimated run time", f"{run} on {est.workers} worker(s) (upper bound: every request runs to max_tokens)")
    return table
