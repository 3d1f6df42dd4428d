"""The control plane of `batchinfer serve` in the cluster mode: the sweep and webhook delivery, run where the
fleet's front door is always up, so a fleet scaled to zero still expires, cancels, finalizes and notifies.

The sweep goes through cluster.sweep.maybe_sweep: its shared rate and Redis lock make every server and worker
together run it once per sweep_interval_s. Webhook delivery claims each event under a lease (SKIP LOCKED), so
several servers and workers deliver each event once.
"""
from __future__ import annotations

import logging
import threading

import redis

from batchinfer.cluster.registry import WorkerRegistry, open_registry
from batchinfer.cluster.sweep import maybe_sweep
from batchinfer.context import AppContext
from batchinfer.errors import one_line
from batchinfer.jobs import outage
from batchinfer.jobs.faults import is_transient
from batchinfer.jobs.webhooks.delivery import DeliveryLoop
from batchinfer.runtime.commands.sender import Sender
from batchinfer.runtime.commands.sweep import server_hooks

log = logging.getLogger(__name__)


class ControlPlane:
    def __init__(self, ctx: AppContext, sender: Sender, registry: WorkerRegistry | None = None):
        self.ctx = ctx
        self.registry = registry or open_registry(ctx.settings)
        self.hooks = server_hooks(ctx, sender, self.registry)
        # half the interval: the shared rate decides when a sweep is due, this only bounds how late it starts
        self.every_s = min(max(ctx.settings.sweep_interval_s / 2, 0.1), 2.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batchinfer-control-plane", daemon=True)
        self._webhooks: DeliveryLoop | None = None

    def start(self) -> ControlPlane:
        self._thread.start()
        self._webhooks = DeliveryLoop(self.ctx).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._webhooks is not None:
            self._webhooks.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def tick(self) -> None:
        """One chance to sweep; any fault is logged and tried again next tick (the server must outlive it)."""
        try:
            maybe_sweep(self.ctx, self.registry, self.hooks)
        except Exception as exc:
            outage.observe(self.ctx, exc, None)  # `status` names the service that is down
            if isinstance(exc, redis.RedisError) or is_transient(exc):
                log.warning("sweep: %s; will retry", one_line(exc))
            else:
                log.exception("sweep failed")
