"""`batchinfer worker`: one Celery worker process that loads its model once and runs units one at a time.
It serves one model (BATCHINFER_MODEL / BATCHINFER_MODEL_ID, or `--model` / `--model-id`) and announces it.

Beside Celery runs the worker agent: it publishes this worker's state (incarnation, the unit it runs),
steals units queued for a busy peer when idle, and runs the sweep (batchinfer.cluster.sweep) when due.
A second thread delivers the webhook outbox (batchinfer.jobs.webhooks.delivery).
"""
from __future__ import annotations

import logging
import os
import socket
import warnings

from celery import signals

from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, model_queue, worker_queue
from batchinfer.cluster.sweep import maybe_sweep
from batchinfer.settings import get_settings
from batchinfer.cluster.agent import WorkerAgent
from batchinfer.errors import one_line
from batchinfer.jobs import outage
from batchinfer.jobs.webhooks.delivery import DeliveryLoop


def _lost_ack_in_one_line(record: logging.LogRecord) -> bool:
    """An ack lost while the broker is down is no error of ours (the message comes back once it is, and its run
    finds the unit done): one warning line instead of Celery's critical traceback."""
    if str(record.msg).startswith("Couldn't ack"):
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg += " (the broker is down: the unit comes back once it answers, and its run finds it done)"
    return True


def start_worker(name: str | None, queues: list[str], loglevel: str = "INFO") -> None:
    from batchinfer.cluster.registry import open_registry  # lazy: the Celery app reads the settings the command line set
    from batchinfer.runtime.commands.run_unit import load_engine
    from batchinfer.runtime.commands.sweep import sweep_hooks
    from workers import tasks
    from workers.process import this_process
    from workers.celery_app import app

    settings = get_settings()
    name = name or settings.worker_name or socket.gethostname()
    # the shared queue (dispatch, validation) and the units for this worker and for any worker of its model
    all_queues = list(dict.fromkeys([SHARED_QUEUE, worker_queue(name), model_queue(settings.model_id), *queues]))

    @signals.worker_ready.connect(weak=False)
    def _ready(**_):
        # the choice is made (celery_app pins it), so not its 8-line notice at every broker reconnect; set
        # here, after Celery's logging setup put its own `always` filters first
        warnings.filterwarnings("ignore", r"\s*In Celery 5.1 we introduced an optional breaking change")
        logging.getLogger("celery.worker.request").addFilter(_lost_ack_in_one_line)
        _load_or_exit(load_engine, settings, name)  # the model loads before the first unit arrives
        reg = open_registry(settings)
        process = this_process()
        hooks = sweep_hooks(process.ctx, tasks.SEND, lambda: process.incarnation)
        process.agent = WorkerAgent(reg, name, settings.worker_beat_s, settings.worker_steal,
                                    lambda: maybe_sweep(process.ctx, reg, hooks),
                                    on_fault=lambda exc, needs: outage.observe(process.ctx, exc, needs), model=settings.model_id,
                                    model_path=settings.model, max_loaded_adapters=settings.max_loaded_adapters).start()
        process.webhooks = DeliveryLoop(process.ctx).start()

    @signals.worker_shutting_down.connect(weak=False)
    def _shutting_down(**_):
        this_process().begin_shutdown()

    @signals.worker_shutdown.connect(weak=False)
    def _shutdown(**_):
        this_process().stop()

    _celery_worker(app, ["--pool", "solo", "--hostname", f"{name}@%h", "--queues", ",".join(all_queues),
                         "--loglevel", loglevel, "--without-gossip", "--without-mingle"])


def _load_or_exit(load_engine, settings, name: str) -> None:
    """A model that cannot load here (no GPU free, out of memory, a checkpoint that is not one) ends the worker
    before its first unit, in one line and exit code 1: without its model it would fail every unit it took. A unit
    message it prefetched is sent again by the sweep (no message in the broker for it) and its fence drops the copy."""
    try:
        load_engine(settings)
    except Exception as exc:
        os.write(2, f"error: worker {name} cannot serve model {settings.model_id} here, so it takes no work: "
                    f"{one_line(exc)}\n".encode())
        logging.shutdown()
        os._exit(1)


def _celery_worker(app, args: list[str]) -> None:
    """`celery worker ARGS`, its own click command called without Celery's command group (what
    `app.worker_main` goes through): the group imports every subcommand, the amqp shell's prompt_toolkit among
    them, and scans the installed packages' entry points for plugins, at each start (docs/benchmarks.md, "Start-up,
    fourth pass"). The context is the one the group makes; the group's environment
    overrides (APP, BROKER_URL, RESULT_BACKEND, ...) are not read: the BATCHINFER_ settings name the broker."""
    from celery.bin.base import CLIContext  # lazy: celery's command line, when the worker starts
    from celery.bin.worker import worker  # lazy: celery's command line, when the worker starts

    no_color = os.environ.get("NO_COLOR", "").strip().lower() not in ("", "0", "false", "f", "no", "n", "off")
    worker.main(args=args, prog_name="celery worker", standalone_mode=False,
                obj=CLIContext(app=app, no_color=no_color, workdir=None, quiet=False))
