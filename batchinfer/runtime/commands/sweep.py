"""What the sweep asks of a worker (cluster.sweep.SweepHooks): send a lost unit again, fail one for good, dispatch
pending work, and hand a stale validation to a worker."""
from __future__ import annotations

from typing import Callable

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
