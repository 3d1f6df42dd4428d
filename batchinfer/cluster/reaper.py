"""Rerun what a dead worker held: its private queue goes to the shared queue, and the units it was
running are sent again. A unit that then runs twice commits once (the unit runner's fence), so
nothing is lost and nothing is counted twice."""
from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy import select

from batchinfer.db.models import UnitStatus, WorkUnit
from batchinfer.cluster.registry import WorkerRegistry

log = logging.getLogger(__name__)


def reap_dead_workers(registry: WorkerRegistry, running_units: Callable[[str], list[str]],
                      requeue: Callable[[str], None], forget_after_s: float = 3600.0) -> dict[str, int]:
    """For each dead worker: drain its queue (every time: Redis may still restore messages into it);
    once per dead incarnation, requeue the units it was running. Returns {worker: units requeued}."""
    reaped = {}
    for dead in registry.dead():
        moved = registry.drain(dead.queue)
        if registry.claim(f"{dead.name}:{dead.beat_at}", hold_s=forget_after_s * 2):
            units = set(running_units(dead.name)) | ({dead.unit_id} if dead.unit_id else set())
            for unit_id in sorted(units):
                requeue(unit_id)
            reaped[dead.name] = len(units)
            log.warning("worker %s stopped beating: %d queued units moved to the shared queue, %d units rerun",
                        dead.name, moved, len(units))
        if time.time() - dead.beat_at > forget_after_s:
            registry.forget(dead.name)
    return reaped


def running_units_of(sessions, worker: str) -> list[str]:
    """Units the worker started and did not commit (its queued units travel with the drained queue)."""
    with sessions() as session:
        return list(session.scalars(select(WorkUnit.id).where(
            WorkUnit.status == UnitStatus.RUNNING, WorkUnit.worker == worker)))
