"""Run queued work in this process through the same unit runner the Celery workers use; a unit of another
model that BATCHINFER_MODELS names loads that model here too (once)."""
from __future__ import annotations

import logging
from typing import Callable

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.jobs.lifecycle import sweep_jobs
from batchinfer.db.models import UnitStatus, WorkUnit
from batchinfer.jobs.webhooks.delivery import deliver_due
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.engine_host import get_generator
from batchinfer.jobs.units.generator import Generator
from batchinfer.jobs.outage import ServiceOutage
from batchinfer.jobs.units.waits import UnitReleased
from batchinfer.jobs.units.progress import OnResult
from batchinfer.jobs.units.runner import UnitOutcome, fail_unit, run_unit
from batchinfer.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED_WORKER = "embedded"


def run_pending(ctx: AppContext, on_result: OnResult | None = None,
                on_loaded: Callable[[], None] | None = None,
                load: Callable[[Settings], Generator] = get_generator) -> list[UnitOutcome]:
    """Without a broker the sweep's job-state half runs here: before dispatch, between units and at the end.
    After the run, the webhooks that are due are delivered (one attempt each: the outbox keeps what failed
    for a later run). load gives a model's generator (`batchinfer run`'s comes from its engine process)."""
    sweep_jobs(ctx)
    dispatch(ctx, [EMBEDDED_WORKER])
    unit_ids = _unfinished_units(ctx)  # includes units an interrupted earlier run left behind
    outcomes = []
    loaded = False
    for unit_id, model in unit_ids:
        settings = ctx.settings.for_model(model)
        if settings is None:  # validation refuses such a model; a unit of one can only come from elsewhere
            outcomes.append(fail_unit(ctx, unit_id, f"model {model!r} is not configured here (BATCHINFER_MODELS)"))
            continue
        generator = load(settings)  # each model is loaded once, on its first unit
        if on_loaded and not loaded:
            on_loaded()
            loaded = True
        try:
            outcomes.append(run_unit(ctx, unit_id, generator, EMBEDDED_WORKER, on_result))
        except (UnitReleased, ServiceOutage) as exc:  # it stays queued: the next run (or `status`) takes it up
            log.warning("%s", exc)
        sweep_jobs(ctx)
    deliver_due(ctx)
    return outcomes


def _unfinished_units(ctx: AppContext) -> list[tuple[str, str | None]]:
    """(unit id, model) of every unit not done, oldest first."""
    with ctx.sessions() as session:
        query = (select(WorkUnit.id, WorkUnit.model).where(WorkUnit.status != UnitStatus.DONE)
                 .order_by(WorkUnit.created_at))
        return [(unit_id, model) for unit_id, model in session.execute(query)]
