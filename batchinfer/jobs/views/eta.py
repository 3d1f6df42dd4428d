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
from batchinfer.jobs import engine_rates, record_store
from batchinfer.db.models import Job
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.planner import PlanEstimate, PlannerConfig, UnitPlan, estimate_plan, plan_units, sized_for
from batchinfer.planner.prefix_tree import PrefixTree, gc_paused

log = logging.getLogger(__name__)

# per job and worker count (the units it is cut into follow the workers): its prepared file is read once per process
_SHAPES: OrderedDict[tuple[str, int], RunShape] = OrderedDict()
_MAX_SHAPES = 256


@dataclass(frozen=True)
class RunShape:
    """What a run costs apart from the rates: prompt tokens to compute (the plan's expected cache hits off)
    and the attention pairs they make, and each unit's max_tokens (its requests decode side by side) with
    each sequence's prompt length (a decode step's rows attend to their whole context)."""

    computed_prompt_tokens: int
    unit_max_tokens: tuple[tuple[int, ...], ...]
    prefill_pairs: int = 0
    unit_prompt_lens: tuple[tuple[int, ...], ...] = ()  # parallel to unit_max_tokens; (): contexts unknown

    def seconds(self, rate: engine_rates.MeasuredRate, workers: int = 1) -> float:
        prompts = self.unit_prompt_lens or (None,) * len(self.unit_max_tokens)
        decode = sum(rate.unit_decode_s(tokens, lens) for tokens, lens in zip(self.unit_max_tokens, prompts))
        return (rate.prefill_seconds(self.computed_prompt_tokens, self.prefill_pairs) + decode) / max(workers, 1)


def prefill_pairs(prompt: int, cached: int) -> int:
    """Attention pairs of computing a prompt's tokens at positions [c, prompt): n*c + n(n+1)/2, n = prompt - c
    (one token at least is computed, whatever the cache holds)."""
    c = min(cached, prompt - 1)
    n = prompt - c
    return n * c + n * (n + 1) // 2


def shape_of(estimate: PlanEstimate, units: list[UnitPlan], block_size: int = 16) -> RunShape:
    """The shape of a plan (`plan`'s estimate and its units). Each request's cached tokens are those a
    prefix cache finds when the units run in order and every block, once computed, stays (the plan's
    expected_cached_tokens, request by request)."""
    requests = [r for unit in units for r in unit.requests]
    with gc_paused():
        cached = PrefixTree(requests, block_size).cached_in_order(list(range(len(requests)))) if requests else []
    pairs = sum(prefill_pairs(len(r.prompt_token_ids), c) for r, c in zip(requests, cached))
    return RunShape(estimate.prompt_tokens - estimate.expected_cached_tokens,
                    tuple(tuple(r.max_tokens for r in unit.requests for _ in range(r.n)) for unit in units),
                    pairs,
                    tuple(tuple(len(r.prompt_token_ids) for r in unit.requests for _ in range(r.n)) for unit in units))


def _shape(ctx: AppContext, job_id: str, config: PlannerConfig, workers: int, base: str = "") -> RunShape:
    key = job_id, workers
    shape = _SHAPES.get(key)
    if shape is None:
        prepared = record_store.read_prepared(ctx.storage, job_id)
        pending = [prepared[i].to_pending(job_id, base=base) for i in sorted(prepared)]
        units = plan_units(pending, sized_for(config, len(pending), workers))  # the units dispatch would cut
        shape = _SHAPES[key] = shape_of(estimate_plan(pending, config), units, config.block_size)
        while len(_SHAPES) > _MAX_SHAPES:
            _SHAPES.popitem(last=False)
    _SHAPES.move_to_end(key)
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
        shape = _shape(ctx, job.id, config, workers, job.model)
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
