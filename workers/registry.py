"""The worker registry in Redis (batchinfer.worker_registry) as this deployment configures it, and the dispatch lock."""
from __future__ import annotations

import redis

from batchinfer.settings import Settings
from batchinfer.worker_registry import WorkerRegistry


def client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker_url)


def worker_registry(settings: Settings) -> WorkerRegistry:
    return WorkerRegistry(client(settings), settings.broker_prefix, ttl_s=settings.worker_ttl_s)


def live_workers(settings: Settings) -> list[str]:
    return [w.name for w in worker_registry(settings).live()]


def dispatch_lock(settings: Settings):
    """Serializes dispatchers so concurrent submissions get planned together, never twice."""
    return client(settings).lock(f"{settings.broker_prefix}batchinfer:dispatch-lock", timeout=600, blocking_timeout=120)
