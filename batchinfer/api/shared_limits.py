"""The API's limits shared by every server process through Redis (the cluster mode): N servers behind a
balancer allow a key what one would. Each check is one Lua script (atomic, on Redis' clock). A request in
flight holds a place with a lease that its server renews while the request lasts, so a server that dies
frees its places within the lease.

Redis down: the limits fail open to this process's own (api/limits.py, what one server allows), with one
warning, not a refusal: the API keeps serving status, lists and downloads through a broker outage
(docs/outages.md), and a key can then get at most N times its limits for the outage, never unlimited."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from starlette.concurrency import run_in_threadpool

from batchinfer.api.limits import Limits, Ticket
from batchinfer.settings import Settings

if TYPE_CHECKING:
    import redis  # lazy: redis, the cluster mode's only

log = logging.getLogger(__name__)
RETRY_S = 5.0  # after Redis failed, this process's own limits for this long before Redis is tried again
TIMEOUT_S = 0.5  # one Redis call; past it this request falls back (the API must not hang on Redis)

# (level before taking) of a token bucket of ARGV[1] tokens refilled at ARGV[2] a second, after taking ARGV[3]
# tokens when it holds them; forgotten (full again) after ARGV[4] ms untouched
_TAKE = """
local cap, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local saved = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = math.min(cap, (tonumber(saved[1]) or cap) + math.max(0, now - (tonumber(saved[2]) or now)) * rate)
local left = level
if cost > 0 and level >= cost then left = level - cost end
redis.call('HSET', KEYS[1], 'level', tostring(left), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return tostring(level)
"""
# 1 and a place (member ARGV[3], lease ARGV[2] s) when fewer than ARGV[1] live places are held, else 0
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000))
return 1
"""
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 1000))
return renewed
"""


def open_limits(settings: Settings) -> Limits:
    """Shared through Redis when the broker is Redis (the cluster mode), else this process's own."""
    if settings.broker_url and settings.broker_url.startswith(("redis://", "rediss://")):
        return SharedLimits(settings)
    return Limits(settings)


class SharedLimits(Limits):
    def __init__(self, settings: Settings):
        import redis  # lazy: redis, the cluster mode's only
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        super().__init__(settings)
        assert settings.broker_url is not None
        self.conn: redis.Redis = redis.Redis.from_url(settings.broker_url, socket_timeout=TIMEOUT_S,
                                                      socket_connect_timeout=TIMEOUT_S, retry=Retry(NoBackoff(), 0))
        self.prefix = f"{settings.broker_prefix}batchinfer:limit:"
        self.lease_s = settings.api_in_flight_lease_s
        self._take, self._enter, self._renew = (self.conn.register_script(s) for s in (_TAKE, _ENTER, _RENEW))
        self._down_until = 0.0

    async def auth_wait(self, address: str) -> int:
        level = await self._shared(lambda: self._level("auth", address, self.failures, 0))
        return await super().auth_wait(address) if level is None else self.failures.wait_for(level)

    async def auth_failed(self, address: str) -> None:
        if await self._shared(lambda: self._level("auth", address, self.failures, 1)) is None:
            await super().auth_failed(address)

    async def take(self, key_id: str) -> int:
        level = await self._shared(lambda: self._level("rate", key_id, self.requests, 1))
        return await super().take(key_id) if level is None else self.requests.wait_for(level)

    async def enter(self, kind: str, key_id: str) -> Ticket | None:
        ticket = Ticket(kind, key_id, shared=True)
        entered = await self._shared(lambda: self._enter(keys=[self._places(ticket)],
                                                         args=[self.limit(kind), self.lease_s, ticket.token]))
        if entered is None:
            return await super().enter(kind, key_id)
        if not entered:
            return None
        ticket.renewer = asyncio.get_running_loop().create_task(self._keep(ticket))
        return ticket

    async def leave(self, ticket: Ticket) -> None:
        if not ticket.shared:
            await super().leave(ticket)
            return
        ticket.renewer.cancel()
        # Redis down: the place stays held until its lease ends
        await self._shared(lambda: self.conn.zrem(self._places(ticket), ticket.token))

    def _level(self, bucket: str, name: str, buckets, cost: int) -> float:
        forget_ms = int(buckets.capacity / buckets.rate * 1000) + 1000  # full again by then
        return float(self._take(keys=[f"{self.prefix}{bucket}:{name}"],
                                args=[buckets.capacity, buckets.rate, cost, forget_ms]).decode())

    def _places(self, ticket: Ticket) -> str:
        return f"{self.prefix}{ticket.kind}:{ticket.name}"

    async def _keep(self, ticket: Ticket) -> None:
        """Renew the place's lease while its request lasts (an upload or an estimate may outlast one lease)."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self._shared(lambda: self._renew(keys=[self._places(ticket)], args=[self.lease_s, ticket.token]))

    async def _shared(self, call: Callable[[], Any]) -> Any:
        """call()'s answer from Redis, or None when Redis does not answer (the caller falls back)."""
        import redis  # lazy: redis, the cluster mode's only

        if time.monotonic() < self._down_until:
            return None
        try:
            answer = await run_in_threadpool(call)
        except redis.RedisError as exc:
            if not self._down_until:
                log.warning("Redis does not answer (%s): the API's limits are this server's own until it does",
                            type(exc).__name__)
            self._down_until = time.monotonic() + RETRY_S
            return None
        if self._down_until:
            log.warning("Redis answers again: the API's limits are shared by every server again")
            self._down_until = 0.0
        return answer
