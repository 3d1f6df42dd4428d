"""`batchinfer worker`: one Celery worker process that loads the model once and runs units one at a time.

Beside Celery runs the worker agent: it publishes this worker's state, steals units queued for a busy
peer when idle, and reruns what a dead peer held.
"""
from __future__ import annotations

import socket

from celery import signals

from batchinfer.jobs import service
from batchinfer.runtime.engine_host import get_generator
from batchinfer.cluster.reaper import reap_dead_workers, running_units_of
from batchinfer.cluster.routing import SHARED_QUEUE, worker_queue
from batchinfer.settings import get_settings
from batchinfer.cluster.agent import WorkerAgent


def _housekeeping(reg, ctx, requeue):
    """Each agent tick: rerun what dead workers held, and expire jobs whose completion window passed."""
    def tick() -> None:
        reap_dead_workers(reg, lambda w: running_units_of(ctx.sessions, w), requeue)
        service.expire_overdue(ctx)
    return tick


def start_worker(name: str | None, queues: list[str], loglevel: str = "INFO") -> None:
    from workers import registry, tasks
    from workers.celery_app import app

    settings = get_settings()
    name = name or settings.worker_name or socket.gethostname()
    all_queues = list(dict.fromkeys([SHARED_QUEUE, worker_queue(name), *queues]))

    @signals.worker_ready.connect(weak=False)
    def _ready(**_):
        get_generator(settings)  # load the model before the first unit arrives
        reg = registry.worker_registry(settings)
        tasks.agent = WorkerAgent(reg, name, settings.worker_beat_s, settings.worker_steal,
                                  _housekeeping(reg, tasks.context(), tasks.requeue_unit)).start()

    @signals.worker_shutdown.connect(weak=False)
    def _shutdown(**_):
        if tasks.agent is not None:
            tasks.agent.stop()

    app.worker_main(["worker", "--pool", "solo", "--hostname", f"{name}@%h", "--queues", ",".join(all_queues),
                     "--loglevel", loglevel, "--without-gossip", "--without-mingle"])
