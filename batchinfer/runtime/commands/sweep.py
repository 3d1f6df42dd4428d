"""What the sweep asks of a worker (cluster.sweep.SweepHooks): send a lost unit again, fail one for good, dispatch
pending work, and hand a stale validation to a worker."""
from __future__ import annotations

from typing import Callable

from batchinfer.cluster.registry import WorkerRegistry
from batchinfer.cluster.sweep import SweepHooks
from batchinfer.context import AppContext
from batchinfer.db.models import WorkUnit
from batchinfer.jobs.units.runner import fail_unit
from batchinfer.runtime.commands.dispatch_round import DispatchRound
from batchinfer.runtime.commands.run_unit import unit_queue
from batchinfer.runtime.commands.sender import Sender


def sweep_hooks(ctx: AppContext, sender: Sender, incarnation: Callable[[], str | None]) -> SweepHooks:
    """incarnation: this worker's, asked at each dispatch (the sweep's dispatcher holds the lock under it)."""
    def fail(unit_id: str, cause: str):
        with ctx.sessions() as session:
            unit = session.get(WorkUnit, unit_id)
            last = unit.last_error if unit is not None else None
        return fail_unit(ctx, unit_id, f"{cause}; last error: {last}" if last else cause).committed

    # the unit runner's fence keeps a unit sent again from counting twice
    return SweepHooks(requeue=lambda unit_id: sender.unit(unit_id, unit_queue(ctx, unit_id)), fail=fail,
                      dispatch=lambda: DispatchRound(ctx, sender, incarnation()).run(), revalidate=sender.validation)


def server_hooks(ctx: AppContext, sender: Sender, registry: WorkerRegistry) -> SweepHooks:
    """The sweep's hooks in `batchinfer serve`: what runs is sent to workers as messages. A dispatch is asked of
    a worker only while one lives (with none, nothing could run what it plans) and once per worker TTL at most
    (a message at every sweep would pile up in the queue of a fleet scaled to zero)."""
    hooks = sweep_hooks(ctx, sender, lambda: None)

    def dispatch() -> None:
        if registry.live() and registry.due("control-plane-dispatch", ctx.settings.worker_ttl_s):
            sender.dispatch(0)

    return SweepHooks(requeue=hooks.requeue, fail=hooks.fail, dispatch=dispatch, revalidate=sender.validation)
