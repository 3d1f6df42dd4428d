"""A fair share of validation and estimate work between keys in the cluster mode: each key's items wait in a
Redis list of their own, and for each item the API sends the workers a message that names no item
(workers.tasks.fair_work_task); the worker that gets a message takes an item of the key served longest ago (a
key never served, or not for a day, first). One key's flood of big validations then delays another key's
one-line batch by at most the items already running, whatever the flood left queued: the order is decided when
a worker is free, not when the messages were sent.

A message and an item are not tied together: a lost message leaves an item that the next message takes (or, for
a validation, the sweep's `validating` recovery redoes), and a message with nothing left to take does nothing.
Validations are idempotent (jobs.intake.validate_job), so an item the sweep already handed on costs a no-op.
One Redis, not a Redis Cluster: the pop script names the chosen key's list itself."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis  # lazy: redis, when the queue is opened

SERVED_KEEP_S = 86400  # how long a key's last turn is remembered

# push: the item ARGV[2] on the key ARGV[1]'s list; the key joins the ready set with its last turn (0: never)
_PUSH = """
redis.call('RPUSH', KEYS[1], ARGV[2])
local served = redis.call('GET', KEYS[3]) or '0'
redis.call('ZADD', KEYS[2], 'NX', served, ARGV[1])
return 1
"""
# pop: the first item of the ready key with the oldest turn; it gets a new turn (the next clock tick)
_POP = """
local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not first then return false end
local list = ARGV[1] .. 'queue:' .. first
local item = redis.call('LPOP', list)
local turn = redis.call('INCR', KEYS[2])
redis.call('SET', ARGV[1] .. 'served:' .. first, turn, 'EX', ARGV[2])
if redis.call('LLEN', list) == 0 then
  redis.call('ZREM', KEYS[1], first)
else
  redis.call('ZADD', KEYS[1], turn, first)
end
if not item then return false end
return {first, item}
"""


class FairQueue:
    def __init__(self, conn: redis.Redis, key_prefix: str = ""):
        self.conn = conn
        self.base = f"{key_prefix}batchinfer:fair:"
        self._push, self._pop = conn.register_script(_PUSH), conn.register_script(_POP)

    def push(self, owner: str, item: dict) -> None:
        self._push(keys=[self._list(owner), self.base + "ready", self.base + "served:" + owner],
                   args=[owner, json.dumps(item)])

    def pop(self) -> tuple[str, dict] | None:
        """(owner, item) of the key whose turn is oldest, or None when nothing waits."""
        taken = self._pop(keys=[self.base + "ready", self.base + "clock"], args=[self.base, SERVED_KEEP_S])
        if not taken:
            return None
        owner, item = taken
        return _text(owner), json.loads(item)

    def _list(self, owner: str) -> str:
        return f"{self.base}queue:{owner}"


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def open_fair_queue(settings) -> FairQueue:
    import redis  # lazy: redis, when the queue is opened

    assert settings.broker_url is not None
    return FairQueue(redis.Redis.from_url(settings.broker_url, socket_timeout=5, socket_connect_timeout=5),
                     settings.broker_prefix)
