"""The worker registry in Redis (batchinfer.cluster.registry) as this deployment configures it, and the dispatch lock."""
from __future__ import annotations

import redis

from batchinfer.settings import Settings
from batchinfer.cluster.registry import WorkerRegistry, open_registry


def client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker_url)


def worker_registry(settings: Settings) -> WorkerRegistry:
    return open_registry(settings)


def live_workers(settings: Settings) -> list[str]:
    return [w.name for w in worker_registry(settings).live()]


def dispatch_lock(settings: Settings):
    """Serializes dispatchers so concurrent submissions get planned together, never twice."""
    return client(settings).lock(f"{settings.broker_prefix}batchinfer:dispatch-lock", timeout=600, blocking_timeout=120)
