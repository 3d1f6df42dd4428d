"""This worker process in one object: its context, and (under `batchinfer worker`) its agent and webhook loop.
The tasks take it from this_process(); `batchinfer worker` starts and stops what it holds."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from batchinfer.context import AppContext
from batchinfer.settings import get_settings
from batchinfer.cluster.registry import live_models_reader

if TYPE_CHECKING:
    from batchinfer.cluster.agent import WorkerAgent
    from batchinfer.jobs.webhooks.delivery import DeliveryLoop


@dataclass
class WorkerProcess:
    ctx: AppContext
    agent: WorkerAgent | None = None  # publishes this worker's state and runs the sweep; None outside a worker
    webhooks: DeliveryLoop | None = None  # delivers the webhook outbox
    drain_deadline: float | None = None  # set by the first SIGTERM/SIGINT: when the running unit's engine stops

    @property
    def incarnation(self) -> str | None:
        return self.agent.state.incarnation if self.agent is not None else None

    def stopping(self) -> bool:
        """Celery or the agent is shutting this process down: a unit it interrupts is rerun by the sweep."""
        from celery.worker import state  # lazy: celery, inside a worker only

        return bool(state.should_stop or state.should_terminate or (self.agent is not None and self.agent.stopping))

    def drain_at(self) -> float | None:
        return self.drain_deadline

    def begin_shutdown(self) -> None:
        """The first signal drains (Celery takes no new unit; the running one stops its engine by the deadline,
        commits what finished and gives the rest back); a second one exits at once, as Celery's cold shutdown
        would. Runs in the signal handler: no logging (its locks), one line written straight to stderr."""
        if self.drain_deadline is not None:
            _say("worker: a second signal; exiting now (the unit it ran runs again elsewhere)")
            os._exit(1)
        drain_s = self.ctx.settings.drain_s
        self.drain_deadline = time.time() + drain_s
        if self.agent is not None:
            self.agent.stopping = True
        _say(f"worker: draining: no new unit; the running unit's engine stops within {drain_s:g} s "
             "(BATCHINFER_DRAIN_S), what finished is committed and the rest goes back to pending")

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.webhooks is not None:
            self.webhooks.stop()


def _say(line: str) -> None:
    os.write(2, (line + "\n").encode())


@lru_cache(maxsize=1)
def this_process() -> WorkerProcess:
    ctx = AppContext.create(get_settings(), migrate=False)
    ctx.live_models = live_models_reader(ctx.settings)
    return WorkerProcess(ctx)
