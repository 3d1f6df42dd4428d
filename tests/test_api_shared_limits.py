"""The API's limits shared through Redis (api/shared_limits.py) and the per-key queues of validation and
estimate work on the workers (cluster/fair_queue.py), on the real Redis. Several `SharedLimits` objects stand
for several server processes: they hold one budget between them. Redis down is a closed port, not a mock."""
from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import pytest

from batchinfer.api.limits import Limits
from batchinfer.api.shared_limits import SharedLimits, open_limits
from batchinfer.cluster.fair_queue import FairQueue
from batchinfer.settings import Settings

PER_MIN = 10  # a token every 6 s: none comes back within a test


def settings(broker_url: str, **extra) -> Settings:
    return Settings(broker_url=broker_url, broker_prefix=f"bitest-{uuid.uuid4().hex[:8]}:", api_requests_per_min=PER_MIN,
                    api_auth_failures_per_min=PER_MIN, api_concurrent_estimates=2, **extra)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_servers_share_one_keys_request_rate(redis_server):
    s = settings(f"{redis_server}/0")
    servers = [SharedLimits(s), SharedLimits(s)]

    async def requests() -> list[int]:
        return [await servers[n % 2].take("key_a") for n in range(3 * PER_MIN)]

    waits = asyncio.run(requests())
    assert waits[:PER_MIN] == [0] * PER_MIN  # the bucket, between both servers
    assert all(w >= 1 for w in waits[PER_MIN:])  # in-process limits would let each server pass PER_MIN
    assert asyncio.run(servers[1].take("key_b")) == 0  # another key has its own


def test_failed_authentications_are_counted_across_servers(redis_server):
    s = settings(f"{redis_server}/0")
    a, b = SharedLimits(s), SharedLimits(s)

    async def fail_on_a() -> int:
        for _ in range(PER_MIN):
            await a.auth_failed("10.0.0.9")
        return await b.auth_wait("10.0.0.9")

    assert asyncio.run(fail_on_a()) >= 1
    assert asyncio.run(b.auth_wait("10.0.0.10")) == 0


def test_places_in_flight_are_shared_and_given_back(redis_server):
    s = settings(f"{redis_server}/0")
    a, b = SharedLimits(s), SharedLimits(s)

    async def run() -> None:
        first, second = await a.enter("estimates", "key_a"), await b.enter("estimates", "key_a")
        assert first is not None and second is not None and first.shared
        assert await b.enter("estimates", "key_a") is None and await a.enter("estimates", "key_a") is None
        assert await a.enter("uploads", "key_a") is not None  # another kind
        await a.leave(first)
        third = await b.enter("estimates", "key_a")
        assert third is not None
        for ticket in (second, third):
            await a.leave(ticket)

    asyncio.run(run())


def test_a_dead_servers_places_end_with_their_lease(redis_server):
    import time

    s = settings(f"{redis_server}/0", api_in_flight_lease_s=1)
    dead, alive = SharedLimits(s), SharedLimits(s)

    async def run() -> None:
        for _ in range(2):
            ticket = await dead.enter("estimates", "key_a")
            ticket.renewer.cancel()  # the server is gone: nothing renews or gives back its places
        assert await alive.enter("estimates", "key_a") is None
        deadline = time.time() + 30
        while (ticket := await alive.enter("estimates", "key_a")) is None:
            assert time.time() < deadline, "the dead server's places were never freed"
            await asyncio.sleep(0.2)
        await alive.leave(ticket)

    asyncio.run(run())


def test_a_renewed_place_outlives_its_lease(redis_server):
    s = settings(f"{redis_server}/0", api_in_flight_lease_s=1)
    a, b = SharedLimits(s), SharedLimits(s)

    async def run() -> None:
        held = [await a.enter("estimates", "key_a") for _ in range(2)]
        await asyncio.sleep(2.5)  # 2.5 leases: only the renewals keep them
        assert await b.enter("estimates", "key_a") is None
        for ticket in held:
            await a.leave(ticket)
        assert await b.enter("estimates", "key_a") is not None

    asyncio.run(run())


def test_redis_down_falls_back_to_this_servers_own_limits(caplog):
    limits = open_limits(settings(f"redis://127.0.0.1:{closed_port()}/0"))
    assert isinstance(limits, SharedLimits)

    async def run() -> list[int]:
        ticket = await limits.enter("estimates", "key_a")
        assert ticket is not None and not ticket.shared
        await limits.leave(ticket)
        return [await limits.take("key_a") for _ in range(PER_MIN + 1)]

    with caplog.at_level(logging.WARNING, logger="batchinfer.api.shared_limits"):
        waits = asyncio.run(run())
    assert waits[:PER_MIN] == [0] * PER_MIN and waits[PER_MIN] >= 1  # limited still, by this process
    warnings = [r for r in caplog.records if "Redis does not answer" in r.getMessage()]
    assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)  # one line, no traceback


def test_the_embedded_server_keeps_its_limits_in_process():
    limits = open_limits(Settings(broker_url=None))
    assert type(limits) is Limits


@pytest.fixture
def fair(redis_server):
    import redis

    conn = redis.Redis.from_url(f"{redis_server}/0")
    prefix = f"bitest-{uuid.uuid4().hex[:8]}:"
    yield FairQueue(conn, prefix)
    for key in conn.scan_iter(f"{prefix}*"):
        conn.delete(key)


def test_the_fair_queue_serves_the_key_served_longest_ago(fair):
    for n in range(4):
        fair.push("flood", {"n": n})
    assert fair.pop() == ("flood", {"n": 0})
    fair.push("late", {"n": "one line"})
    fair.push("later", {"n": "another"})
    order = [fair.pop() for _ in range(5)]
    assert order[:2] == [("late", {"n": "one line"}), ("later", {"n": "another"})]  # before the flood's 3 left
    assert order[2:] == [("flood", {"n": n}) for n in (1, 2, 3)]
    assert fair.pop() is None


def test_the_fair_queue_alternates_between_busy_keys(fair):
    for n in range(3):
        fair.push("a", {"n": n})
        fair.push("b", {"n": n})
    owners = [fair.pop()[0] for _ in range(6)]
    assert owners in (["a", "b"] * 3, ["b", "a"] * 3)
