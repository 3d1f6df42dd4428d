"""Which workers are alive: each worker refreshes a short-lived Redis key; dispatch lists them for routing."""
from __future__ import annotations

import threading

import redis

from batchinfer.settings import Settings

TTL_S = 30
BEAT_S = 10


def _prefix(settings: Settings) -> str:
    return f"{settings.broker_prefix}batchinfer:worker:"


def client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker_url)


def start_heartbeat(settings: Settings, name: str) -> threading.Event:
    """Keep `name` listed while this process lives; set the returned event to stop."""
    stop = threading.Event()
    conn = client(settings)

    def beat() -> None:
        while True:
            try:
                conn.set(_prefix(settings) + name, "1", ex=TTL_S)
            except redis.RedisError:
                pass  # the broker is down; the worker itself will notice and reconnect
            if stop.wait(BEAT_S):
                conn.delete(_prefix(settings) + name)
                return

    threading.Thread(target=beat, name="batchinfer-heartbeat", daemon=True).start()
    return stop


def live_workers(settings: Settings) -> list[str]:
    prefix = _prefix(settings)
    names = client(settings).scan_iter(match=prefix + "*")
    return sorted(n.decode()[len(prefix):] for n in names)


def dispatch_lock(settings: Settings):
    """Serializes dispatchers so concurrent submissions get planned together, never twice."""
    return client(settings).lock(f"{settings.broker_prefix}batchinfer:dispatch-lock", timeout=600, blocking_timeout=120)
