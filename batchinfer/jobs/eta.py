"""How long a batch will take before any of its requests has finished: its prepared requests planned and
priced at the prefill and decode costs measured on this model (engine_rates), exactly as `plan` prices a
file, so `status` and `plan` agree. Once requests finish, the batch's own pace is the better figure
(cli.progress.eta_s) and this one steps aside."""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from batchinfer.context import AppContext
from batchinfer.errors import one_line
from batchinfer.db.models import JobStatus
from batchinfer.jobs import engine_rates, storage_keys
from batchinfer.jobs.output.records import PreparedRequest
from batchinfer.db.models import Job
from batchinfer.jobs.output.batch_view import batch_object
from batchinfer.planner import PlanEstimate, PlannerConfig, UnitPlan, estimate_plan, plan_units

log = logging.getLogger(__name__)

_SHAPES: OrderedDict[str, RunShape] = OrderedDict()  # per job: its prepared file is read once per process
_MAX_SHAPES = 256


@dataclass(frozen=True)
class RunShape:
    """What a run costs apart from the rates: prompt tokens to compute (the plan's expected cache hits off)
    and each unit's max_tokens (its requests decode side by side)."""

    computed_prompt_tokens: int
    unit_max_tokens: tuple[tuple[int, ...], ...]

    def seconds(self, rate: engine_rates.MeasuredRate, workers: int = 1) -> float:
        decode = sum(rate.unit_decode_s(tokens) for tokens in self.unit_max_tokens)
        return (self.computed_prompt_tokens / rate.prefill_tokens_per_s + decode) / max(workers, 1)


def shape_of(estimate: PlanEstimate, units: list[UnitPlan]) -> RunShape:
    """The shape of a plan (`plan`'s estimate and its units)."""
    return RunShape(estimate.prompt_tokens - estimate.expected_cached_tokens,
                    tuple(tuple(r.max_tokens for r in unit.requests for _ in range(r.n)) for unit in units))


def _shape(ctx: AppContext, job_id: str, config: PlannerConfig) -> RunShape:
    shape = _SHAPES.get(job_id)
    if shape is None:
        with ctx.storage.open_read(storage_keys.job_prepared(job_id)) as stream:
            pending = [PreparedRequest.from_json(raw).to_pending(job_id) for raw in stream if raw.strip()]
        shape = _SHAPES[job_id] = shape_of(estimate_plan(pending, config), plan_units(pending, config))
        while len(_SHAPES) > _MAX_SHAPES:
            _SHAPES.popitem(last=False)
    _SHAPES.move_to_end(job_id)
    return shape


def batch_with_eta(ctx: AppContext, job: Job, config: PlannerConfig, workers: int = 1,
                   now: float | None = None) -> dict:
    """The Batch object (live counts as the job has them) with `estimated_remaining_s` and
    `estimate_source` while it is queued or running and none of its requests has finished (lines refused
    at validation aside). Other batches' units queued ahead of it are not counted."""
    batch = batch_object(job)
    waiting = job.status in (JobStatus.QUEUED, JobStatus.IN_PROGRESS)
    if not waiting or job.completed or job.failed > (job.invalid or 0) or getattr(job, "waiting_for", None):
        return batch
    try:
        shape = _shape(ctx, job.id, config)
    except FileNotFoundError:  # a batch with nothing prepared (nothing to run)
        return batch
    except Exception as exc:  # storage down (jobs.outage): the ETA is a nicety, the status must still answer
        log.info("no ETA for %s: %s", job.id, one_line(exc))
        return batch
    rate = engine_rates.measured(ctx, ctx.settings.model_id)
    started = job.in_progress_at
    elapsed = (now or time.time()) - started if started else 0.0
    where = f"{rate.source}, on {workers} worker{'s' if workers != 1 else ''}"
    return {**batch, "estimated_remaining_s": round(max(shape.seconds(rate, workers) - elapsed, 0.0), 1),
            "estimate_source": f"plan at the measured rates ({where})" if not rate.source.startswith("assumed")
            else f"plan at assumed rates ({where}; {rate.source.split(': ', 1)[-1]})"}
