"""The unit runner's side of the outage policy (jobs.outage): its storage and database steps wait out a fault,
holding the unit's results in memory; a unit still blocked past outage_retry_s is released unfinished.

Released means: back to queued, its requests back to planned, its results dropped (regenerating a unit
costs less than a local spool that another worker could not read), and the run not counted as a failure.
The sweep sends it again once the service answers (cluster.sweep). When the database itself is the one
down, the release cannot be written: UnitReleased says so (recorded False), and the worker leaves a note in
the broker's Redis instead, from which the sweep releases the unit once the database is back.
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

from batchinfer.context import AppContext
from batchinfer.errors import one_line
from batchinfer.jobs import outage
from batchinfer.jobs.faults import DATABASE, STORAGE, service_of
from batchinfer.jobs.state import units

log = logging.getLogger(__name__)
T = TypeVar("T")


class UnitReleased(Exception):
    """The unit went back to the queue unfinished: a service it needs stayed down (nothing failed)."""

    def __init__(self, unit_id: str, attempt: int, service: str, recorded: bool):
        super().__init__(f"unit {unit_id} released: {service} unreachable for longer than the retry bound")
        self.unit_id, self.attempt, self.service, self.recorded = unit_id, attempt, service, recorded


def start_step(ctx: AppContext, unit_id: str, step: Callable[[], T]) -> T:
    """The unit's start (a database step before it holds anything): past the bound it stays queued, and the
    sweep sends it again."""
    return outage.wait_out(ctx, DATABASE, step, f"unit {unit_id}: start")


class UnitSteps:
    """A started unit's storage and database steps: each waits out an outage; past the bound the unit is
    released and UnitReleased raised."""

    def __init__(self, ctx: AppContext, unit_id: str, attempt: int):
        self.ctx, self.unit_id, self.attempt = ctx, unit_id, attempt

    def storage(self, what: str, step: Callable[[], T]) -> T:
        return self._step(STORAGE, what, step)

    def database(self, what: str, step: Callable[[], T]) -> T:
        return self._step(DATABASE, what, step)

    def _step(self, service: str, what: str, step: Callable[[], T]) -> T:
        try:
            return outage.wait_out(self.ctx, service, step, f"unit {self.unit_id}: {what}")
        except outage.ServiceOutage as exc:
            recorded = release(self.ctx, self.unit_id, self.attempt, exc)
            raise UnitReleased(self.unit_id, self.attempt, exc.service, recorded) from exc


def release(ctx: AppContext, unit_id: str, attempt: int, exc: outage.ServiceOutage) -> bool:
    """Record the release; True when the database took it (False: the caller leaves a note for the sweep)."""
    cause = f"waiting for {exc.service}: {one_line(exc.cause)}"
    try:
        if units.release_unit(ctx, unit_id, attempt, exc.service, cause):
            outage.count_release(ctx, exc.service)
        log.warning("unit %s released unfinished (%s); it runs again once %s answers", unit_id, cause[:300], exc.service)
        return True
    except Exception as again:
        if service_of(again) is None:
            raise
    log.warning("unit %s did not commit (%s down); the sweep releases it once the database is back", unit_id, exc.service)
    return False
