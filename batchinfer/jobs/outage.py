"""The outage policy: a step that needs storage, the database or the broker waits out a fault of it.

`wait_out` retries the step with backoff (at most outage_backoff_s apart) for outage_retry_s; past it, it
raises ServiceOutage and the caller releases its work unfinished (a unit goes back to the queue, its
results are dropped) for the sweep to run again once the service answers. Requests never fail for it;
only the completion window ends them (batch_expired).

The health board says which services are down, for `status`, the API, the dashboard and /metrics: one row
per service in the database (service_outages) and a copy in the broker's Redis, so either one tells while
the other is down. Whoever sees a fault reports it, whoever sees the service answer again ends it; a report
not renewed within STALE_S is over (its reporter may have died).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from functools import lru_cache, partial
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, TypeVar

from sqlalchemy import select, text, update

from batchinfer.context import AppContext
from batchinfer.db.models import ServiceOutage as OutageRow
from batchinfer.db.session import transaction
from batchinfer.errors import one_line
from batchinfer.jobs.faults import BROKER, DATABASE, SERVICES, STORAGE, service_of

log = logging.getLogger(__name__)
T = TypeVar("T")
STALE_S = 30.0  # a report of a service down that nobody renewed this long is over
REPORT_EVERY_S = 2.0  # a process renews its report of an outage at most this often
PROBE_KEY = "health/probe"


class ServiceOutage(Exception):
    """A service stayed down past outage_retry_s: the work is released unfinished, never failed."""

    def __init__(self, service: str, cause: BaseException):
        super().__init__(f"{service} unreachable for longer than the retry bound: {one_line(cause)}")
        self.service, self.cause = service, cause


def wait_out(ctx: AppContext, service: str, step: Callable[[], T], what: str) -> T:
    """Run step(); a transient fault of any service is retried with backoff for outage_retry_s, then raised
    as ServiceOutage (of the service that failed, which is not always `service`: a commit reads storage too)."""
    s = ctx.settings
    deadline, delay = time.monotonic() + s.outage_retry_s, 0.5
    while True:
        try:
            result = step()
        except Exception as exc:
            failed = service_of(exc)
            if failed is None:
                raise
            report_down(ctx, failed, exc)
            if time.monotonic() + delay > deadline:
                raise ServiceOutage(failed, exc) from exc
            log.warning("%s: %s is down (%s); trying again in %.1f s", what, failed, one_line(exc)[:200], delay)
            time.sleep(delay)
            delay = min(delay * 2, s.outage_backoff_s)
            continue
        report_up(ctx, service)
        return result


# ---- the health board ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Outage:
    service: str
    since: float
    detail: str | None = None


class _Seen:
    """What this process reported (so it writes a change, and renews an outage, at most every REPORT_EVERY_S)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.down: dict[str, float] = {}  # service -> since
        self.written: dict[str, float] = {}  # service -> last time this process wrote its report
        self.unsaved_ends: dict[str, float] = {}  # outages of the database that ended: counted once it answers


_seen = _Seen()


def report_down(ctx: AppContext, service: str, exc: BaseException | None = None) -> None:
    """`service` failed just now (best effort: the report itself never raises)."""
    now = time.time()
    with _seen.lock:
        since = _seen.down.setdefault(service, now)
        if now - _seen.written.get(service, 0.0) < REPORT_EVERY_S:
            return
        _seen.written[service] = now
    detail = one_line(exc)[:500] if exc is not None else None
    _quietly(lambda: _mirror(ctx, service, {"since": since, "detail": detail}))
    if service != DATABASE:
        _quietly(lambda: _save_down(ctx, service, since, now, detail))


def report_up(ctx: AppContext, service: str, known: bool = False) -> None:
    """`service` answered: an outage this process saw is over (its duration is counted once). known: the
    caller probed it on purpose (the sweep), so a report of any process is ended, not only this one's."""
    with _seen.lock:
        since = _seen.down.pop(service, None)
        _seen.written.pop(service, None)
        if since is not None and service == DATABASE:
            _seen.unsaved_ends[DATABASE] = since
        ends = dict(_seen.unsaved_ends) if service == DATABASE else {}
    if since is None and not ends and not known:
        return
    if since is not None:
        log.warning("%s answers again after %.1f s", service, time.time() - since)
    _quietly(lambda: _mirror(ctx, service, None))
    if service != DATABASE:
        _quietly(lambda: _save_up(ctx, service, None, time.time()))
    for start in ends.values():  # the database's outages this process saw end: counted now that it answers
        if _quietly(partial(_save_up, ctx, DATABASE, start, time.time())):
            with _seen.lock:
                if _seen.unsaved_ends.get(DATABASE) == start:
                    del _seen.unsaved_ends[DATABASE]


def observe(ctx: AppContext, exc: BaseException | None, needs: str | None) -> None:
    """A periodic round (the worker agent's) ended: with a fault (reported down), or fine (`needs` is up)."""
    failed = service_of(exc) if exc is not None else None
    if failed is not None:
        assert exc is not None
        report_down(ctx, failed, exc)
    elif exc is None and needs:
        report_up(ctx, needs)


def count_release(ctx: AppContext, service: str) -> None:
    """A unit run was released for `service` (best effort: the count is for /metrics)."""
    def work() -> None:
        with transaction(ctx.sessions) as session:
            _ensure_row(session, service, time.time())
            session.execute(update(OutageRow).where(OutageRow.service == service)
                            .values(released_units=OutageRow.released_units + 1))
    _quietly(work)


def current(ctx: AppContext, now: float | None = None) -> dict[str, Outage]:
    """The services down now, as reported (the database's rows, and the broker's copy when it answers)."""
    now = now or time.time()
    found: dict[str, Outage] = {}
    try:
        with ctx.sessions() as session:
            for row in session.scalars(select(OutageRow).where(OutageRow.down_since.is_not(None),
                                                               OutageRow.seen_at > now - STALE_S)):
                found[row.service] = Outage(row.service, row.down_since or now, row.detail)
    except Exception as exc:
        if service_of(exc) != DATABASE:
            raise
        found[DATABASE] = Outage(DATABASE, now, one_line(exc)[:500])
    for service, outage in _mirrored(ctx).items():
        found.setdefault(service, outage)
    return found


_probes: dict[str, Future] = {}
_probe_pool = ThreadPoolExecutor(max_workers=len(SERVICES), thread_name_prefix="batchinfer-probe")


def probe(ctx: AppContext, service: str, wait_s: float = 1.0) -> bool:
    """Does `service` answer now? (a HEAD of one key, SELECT 1, PING), reported either way. At most one probe
    of a service is in flight, off the caller's thread: a service that hangs (botocore retries for half a
    minute) costs the caller wait_s, not its heartbeat; its answer is taken up by a later call."""
    future = _probes.get(service)
    if future is None:
        future = _probes[service] = _probe_pool.submit(_probe, ctx, service)
    try:
        answered = future.result(timeout=wait_s)
    except FutureTimeout:
        return False
    del _probes[service]
    return answered


def _probe(ctx: AppContext, service: str) -> bool:
    try:
        if service == STORAGE:
            ctx.storage.exists(PROBE_KEY)
        elif service == DATABASE:
            with ctx.sessions() as session:
                session.execute(text("SELECT 1"))
        elif service == BROKER and not ctx.settings.embedded:
            _redis(ctx).ping()
    except Exception as exc:
        if service_of(exc) is None:
            log.warning("probe of %s: %s", service, one_line(exc))
            return False
        report_down(ctx, service, exc)
        return False
    report_up(ctx, service, known=True)
    return True


# ---- where reports are kept ------------------------------------------------------------------------

def _quietly(work: Callable[[], object]) -> bool:
    try:
        work()
        return True
    except Exception as exc:  # the service that keeps the report may be the one that is down
        log.debug("health report not kept: %s", one_line(exc))
        return False


def _ensure_row(session, service: str, now: float) -> None:
    if session.get(OutageRow, service) is None:
        session.add(OutageRow(service=service, seen_at=now, outages=0, released_units=0, down_s=0.0))
        session.flush()


def _save_down(ctx: AppContext, service: str, since: float, now: float, detail: str | None) -> None:
    with transaction(ctx.sessions) as session:
        _ensure_row(session, service, now)
        row = session.get(OutageRow, service, with_for_update=True)
        if row.down_since is None or row.seen_at < now - STALE_S:  # a new outage (or the last one's report went stale)
            row.down_since, row.outages = since, row.outages + 1
        row.seen_at, row.detail = now, detail


def _save_up(ctx: AppContext, service: str, since: float | None, now: float) -> None:
    with transaction(ctx.sessions) as session:
        _ensure_row(session, service, now)
        row = session.get(OutageRow, service, with_for_update=True)
        if service == DATABASE and since is not None:  # nobody could write its start: counted now
            row.outages, row.down_s = row.outages + 1, row.down_s + (now - since)
        elif row.down_since is not None:
            row.down_s += now - row.down_since
        row.down_since, row.seen_at = None, now


def _redis(ctx: AppContext):
    return _redis_at(ctx.settings.broker_url or "")


@lru_cache(maxsize=8)
def _redis_at(url: str):
    import redis  # lazy: redis, the broker's only (embedded runs have none)

    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


def _mirror_key(ctx: AppContext, service: str) -> str:
    return f"{ctx.settings.broker_prefix}batchinfer:outage:{service}"


def _mirror(ctx: AppContext, service: str, value: dict | None) -> None:
    if ctx.settings.embedded or service == BROKER:
        return
    if value is None:
        _redis(ctx).delete(_mirror_key(ctx, service))
    else:
        _redis(ctx).set(_mirror_key(ctx, service), json.dumps(value), px=int(STALE_S * 1000))


def _mirrored(ctx: AppContext) -> dict[str, Outage]:
    if ctx.settings.embedded:
        return {}
    try:
        raws = _redis(ctx).mget([_mirror_key(ctx, s) for s in SERVICES])
    except Exception:  # the broker down: the database's rows tell
        return {}
    found = {}
    for service, raw in zip(SERVICES, raws):
        if raw is not None:
            value = json.loads(raw)
            found[service] = Outage(service, float(value["since"]), value.get("detail"))
    return found
