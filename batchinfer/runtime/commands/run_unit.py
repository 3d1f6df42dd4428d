"""Run one unit on this worker, with one error policy: whatever stops the run, nothing is counted and the unit
runs again later (the sweep reruns it, or sends it again once a service answers); only the engine process's
death ends the worker, as a crash would."""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, NoReturn

from sqlalchemy import select

from batchinfer.cluster.agent import WorkerAgent
from batchinfer.cluster.registry import open_registry
from batchinfer.context import AppContext
from batchinfer.db.models import WorkUnit
from batchinfer.errors import one_line
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, model_queue
from batchinfer.jobs.outage import ServiceOutage
from batchinfer.jobs.state import units
from batchinfer.jobs.units.runner import UnitInterrupted, UnitOutcome, run_unit
from batchinfer.jobs.units.waits import UnitReleased, start_step
from batchinfer.runtime.commands.sender import Sender
from batchinfer.runtime.engine_process import EngineProcessLost, generator_for

log = logging.getLogger(__name__)


class RunUnit:
    def __init__(self, ctx: AppContext, unit_id: str, worker: str, sender: Sender, agent: WorkerAgent | None = None,
                 incarnation: str | None = None, stopping: Callable[[], bool] = lambda: False,
                 priority: int | None = None, drain_at: Callable[[], float | None] = lambda: None):
        """priority: the broker priority the unit came with (it keeps it when it goes to its own model's queue).
        drain_at: when a draining worker's engine stops (None: not draining)."""
        self.ctx, self.unit_id, self.worker, self.sender = ctx, unit_id, worker, sender
        self.agent, self.incarnation, self.stopping, self.priority = agent, incarnation, stopping, priority
        self.drain_at = drain_at

    def run(self) -> dict:
        outcome = None
        try:
            outcome = self._run()
        except EngineProcessLost as exc:
            engine_lost(exc)
        except UnitInterrupted as exc:  # the unit stays running on this incarnation; the sweep reruns it
            log.warning("unit %s interrupted by shutdown (%s); it will be rerun", self.unit_id, exc)
        except (UnitReleased, ServiceOutage) as exc:  # a service stayed down: the sweep sends it again once it answers
            log.warning("%s; it runs again once that service answers", exc)
            if isinstance(exc, UnitReleased) and not exc.recorded:
                self._leave_release(exc)
        except Exception as exc:  # storage or database still down after retries: the sweep reruns it, then fails it
            log.warning("unit %s did not commit: %s: %s; it will be rerun", self.unit_id, type(exc).__name__, str(exc)[:300])
            self._note_error(f"{type(exc).__name__}: {str(exc)[:300]}")
        return {"unit_id": self.unit_id, "committed": bool(outcome and outcome.committed),
                "completed": outcome.completed if outcome else 0}

    def _run(self) -> UnitOutcome | None:
        # the database down: waited out as the unit's start would be, then left to the sweep
        elsewhere = start_step(self.ctx, self.unit_id, lambda: _other_model(self.ctx, self.unit_id))
        if elsewhere is not None:  # sent here by a path that knows no models (an old message): to its model's workers
            self.sender.unit(self.unit_id, model_queue(elsewhere), priority=self.priority)
            log.info("unit %s is for model %s, not this worker's: sent to its queue", self.unit_id, elsewhere)
            return None
        started, outcome = time.time(), None
        if self.agent is not None:
            self.agent.unit_started(self.unit_id)
        try:
            outcome = run_unit(self.ctx, self.unit_id, load_engine(self.ctx.settings), self.worker,
                               incarnation=self.incarnation, stopping=self.stopping, drain_at=self.drain_at)
            if outcome.given_back:  # a peer plans them now, not at the sweep's next look
                log.warning("unit %s drained: %d finished requests committed at its end, %d back to pending", self.unit_id,
                            outcome.completed + outcome.failed, outcome.given_back)
                self.sender.dispatch(0)
            return outcome
        finally:
            if self.agent is not None:
                self.agent.unit_finished(outcome.prefix_key if outcome else "", outcome.work_tokens if outcome else 0,
                                         time.time() - started, outcome.adapters if outcome else ())

    def _leave_release(self, released: UnitReleased) -> None:
        """The database could not take the release: the broker keeps it until the sweep can write it."""
        try:
            open_registry(self.ctx.settings).note_released(released.unit_id, released.attempt, released.service)
        except Exception as exc:  # the broker down too: the sweep reruns the unit as lost (one attempt counted)
            log.warning("unit %s: could not leave its release for the sweep: %s", released.unit_id, one_line(exc))

    def _note_error(self, cause: str) -> None:
        """Best effort: the cause shows in the error lines if the unit fails for good."""
        try:
            units.note_unit_error(self.ctx, self.unit_id, cause)
        except Exception:
            log.warning("could not record the error of unit %s", self.unit_id)


def load_engine(settings):
    """The worker's generator (through its engine process, when it forked one)."""
    try:
        return generator_for(settings)
    except EngineProcessLost as exc:
        engine_lost(exc)


def engine_lost(exc: EngineProcessLost) -> NoReturn:
    """The engine process killed (out of memory, a signal) is this worker's death too: it exits as a crash would,
    and the sweep reruns the unit it held (no request of it is failed)."""
    log.critical("%s: this worker stops; its unit runs again", exc)
    logging.shutdown()
    os._exit(70)


def unit_model(ctx: AppContext, unit_id: str) -> str | None:
    with ctx.sessions() as session:
        return session.scalar(select(WorkUnit.model).where(WorkUnit.id == unit_id))


def _other_model(ctx: AppContext, unit_id: str) -> str | None:
    """The unit's model when it is not this worker's (None: this worker's, or a unit from before models)."""
    model = unit_model(ctx, unit_id)
    return model if model and model != ctx.settings.model_id else None


def unit_queue(ctx: AppContext, unit_id: str) -> str:
    """Where a unit the sweep found lost runs again: a worker of its model."""
    model = unit_model(ctx, unit_id)
    return model_queue(model) if model else SHARED_QUEUE
