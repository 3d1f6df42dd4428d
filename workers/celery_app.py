"""The Celery app: Redis broker, late acks, one unit at a time per worker process.

`celery -A workers.celery_app worker` works; `batchinfer worker` adds the per-worker queue and a heartbeat.
"""
from __future__ import annotations

from celery import Celery

from batchinfer.jobs.dispatch.routing import SHARED_QUEUE
from batchinfer.settings import Settings, get_settings


def make_app(settings: Settings) -> Celery:
    app = Celery("batchinfer", broker=settings.broker_url or "memory://", include=["workers.tasks"])
    transport: dict[str, int | str] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.broker_prefix:
        transport["global_keyprefix"] = settings.broker_prefix
    app.conf.update(
        task_acks_late=True,  # a unit lost with its worker is delivered again
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # never hold a unit another worker could run now
        broker_transport_options=transport,
        task_default_queue=SHARED_QUEUE,
        task_time_limit=settings.unit_time_limit_s,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        # A broker reconnect leaves the running unit alone (the default until Celery 6, pinned): the solo pool
        # cannot cancel it, and its ack lost with the connection only costs a redelivery the fence drops.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_send_task_events=True,  # Flower
        task_send_sent_event=True,
    )
    return app


app = make_app(get_settings())
