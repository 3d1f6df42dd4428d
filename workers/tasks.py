"""Task entry points. Tasks take ids only; everything else comes from the database and storage."""
from __future__ import annotations

import logging
import time
from functools import lru_cache

from batchinfer.jobs import service
from batchinfer.context import AppContext
from batchinfer.runtime.dispatch import DispatchedUnit, dispatch
from batchinfer.runtime.engine_host import get_generator
from batchinfer.cluster.routing import SHARED_QUEUE
from batchinfer.settings import get_settings
from batchinfer.runtime.unit_runner import run_unit
from workers import registry
from workers.celery_app import app

log = logging.getLogger(__name__)
DISPATCH_TASK = "batchinfer.runtime.dispatch"
RUN_UNIT_TASK = "batchinfer.run_unit"
agent = None  # the WorkerAgent of this process, set by `batchinfer worker`


@lru_cache(maxsize=1)
def context() -> AppContext:
    return AppContext.create(get_settings(), migrate=False)


def dispatch_units(ctx: AppContext) -> list[DispatchedUnit]:
    """Plan what is pending and route it on the registry's view of the live workers (enqueues nothing)."""
    service.expire_overdue(ctx)
    loads = registry.worker_registry(ctx.settings).loads()
    return dispatch(ctx, [w.name for w in loads], worker_loads=loads)


@app.task(name=DISPATCH_TASK)
def dispatch_task() -> int:
    ctx = context()
    with registry.dispatch_lock(ctx.settings):
        units = dispatch_units(ctx)
        for unit in units:
            run_unit_task.apply_async(args=[unit.unit_id], queue=unit.queue, priority=unit.priority)
    log.info("dispatched %d units", len(units))
    return len(units)


@app.task(name=RUN_UNIT_TASK, bind=True)
def run_unit_task(self, unit_id: str) -> dict:
    ctx = context()
    worker = (self.request.hostname or "worker").split("@")[0]
    started = time.time()
    if agent is not None:
        agent.unit_started(unit_id)
    outcome = None
    try:
        outcome = run_unit(ctx, unit_id, get_generator(ctx.settings), worker)
    finally:
        if agent is not None:
            agent.unit_finished(outcome.prefix_key if outcome else "", outcome.work_tokens if outcome else 0,
                                time.time() - started)
    return {"unit_id": unit_id, "committed": outcome.committed, "completed": outcome.completed}


def requeue_unit(unit_id: str) -> None:
    """Run a unit again (its worker died); the unit runner's fence keeps it from counting twice."""
    run_unit_task.apply_async(args=[unit_id], queue=SHARED_QUEUE)


def trigger_dispatch(countdown: float | None = None) -> None:
    """Called after a submit: the short countdown lets concurrent submissions be planned together."""
    delay = get_settings().dispatch_countdown_s if countdown is None else countdown
    dispatch_task.apply_async(countdown=delay, queue=SHARED_QUEUE)
