"""`batchinfer worker`: one Celery worker process that loads the model once and runs units one at a time."""
from __future__ import annotations

import socket

from celery import signals

from batchinfer.engine_host import get_generator
from batchinfer.routing import SHARED_QUEUE, worker_queue
from batchinfer.settings import get_settings


def start_worker(name: str | None, queues: list[str], loglevel: str = "INFO") -> None:
    from workers import registry
    from workers.celery_app import app

    settings = get_settings()
    name = name or settings.worker_name or socket.gethostname()
    all_queues = list(dict.fromkeys([SHARED_QUEUE, worker_queue(name), *queues]))

    @signals.worker_ready.connect(weak=False)
    def _ready(**_):
        get_generator(settings)  # load the model before the first unit arrives
        registry.start_heartbeat(settings, name)

    app.worker_main(["worker", "--pool", "solo", "--hostname", f"{name}@%h", "--queues", ",".join(all_queues),
                     "--loglevel", loglevel, "--without-gossip", "--without-mingle"])
