"""Run queued work in this process through the same unit runner the Celery workers use."""
from __future__ import annotations

from typing import Callable

from batchinfer.context import AppContext
from batchinfer.dispatch import dispatch
from batchinfer.engine_host import get_generator
from batchinfer.unit_runner import UnitOutcome, run_unit

EMBEDDED_WORKER = "embedded"


def run_pending(ctx: AppContext, on_result: Callable[[object], None] | None = None,
                on_loaded: Callable[[], None] | None = None) -> list[UnitOutcome]:
    units = dispatch(ctx, [EMBEDDED_WORKER])
    if not units:
        return []
    generator = get_generator(ctx.settings)
    if on_loaded:
        on_loaded()
    return [run_unit(ctx, unit.unit_id, generator, EMBEDDED_WORKER, on_result) for unit in units]
