"""The worker registry in Redis (batchinfer.cluster.registry) as this deployment configures it, and the dispatch lock."""
from __future__ import annotations

from typing import TYPE_CHECKING

from batchinfer.settings import Settings
from batchinfer.cluster.registry import WorkerRegistry, open_registry

if TYPE_CHECKING:
    import redis


def client(settings: Settings) -> redis.Redis:
    import redis  # on use: the CLI imports this module (bench-load) and must not pay for redis at every start

    if not settings.broker_url:
        raise ValueError("BATCHINFER_BROKER_URL is not set: the worker registry lives in the broker's Redis")
    return redis.Redis.from_url(settings.broker_url)


def worker_registry(settings: Settings) -> WorkerRegistry:
    return open_registry(settings)


def live_workers(settings: Settings) -> list[str]:
    return [w.name for w in worker_registry(settings).live()]


def dispatch_lock(settings: Settings):
    """Serializes dispatchers so concurrent submissions get planned together, never twice."""
    return client(settings).lock(open_registry(settings).dispatch_key(), timeout=600, blocking_timeout=120)
