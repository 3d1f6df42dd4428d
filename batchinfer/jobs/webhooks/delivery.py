"""Deliver the webhook outbox: claim due events (SKIP LOCKED, then a lease), POST each signed, and record
the answer. Retries back off exponentially for up to webhook_max_age_s; all state lives in the table,
so a restarted worker carries on. A success is recorded at most once per event (a conditional UPDATE)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy import select, update

from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey, WebhookEvent, WebhookStatus
from batchinfer.db.session import transaction
from batchinfer.jobs.faults import is_transient
from batchinfer.errors import one_line
from batchinfer.jobs.webhooks import sender as webhook_http
from batchinfer.jobs.webhooks.signing import headers
from batchinfer.jobs.webhooks.target import UnsafeTarget

log = logging.getLogger(__name__)
CLAIM_BATCH = 20


@dataclass(frozen=True)
class Claim:
    id: str
    owner_id: str | None
    url: str
    body: str
    attempts: int
    created_at: float


def claim_due(ctx: AppContext, now: float, limit: int = CLAIM_BATCH) -> list[Claim]:
    """Due events, each leased to this caller until its POST has had time to time out."""
    lease = now + ctx.settings.webhook_timeout_s * 2 + 5
    with transaction(ctx.sessions) as session:
        rows = list(session.scalars(select(WebhookEvent).where(WebhookEvent.status == WebhookStatus.PENDING,
                                                               WebhookEvent.next_attempt_at <= now)
                                    .order_by(WebhookEvent.next_attempt_at).limit(limit)
                                    .with_for_update(skip_locked=True)))
        for row in rows:
            row.attempts += 1
            row.next_attempt_at = lease
        return [Claim(r.id, r.owner_id, r.url, r.body, r.attempts, r.created_at) for r in rows]


def signing_secret(ctx: AppContext, owner_id: str | None) -> str | None:
    """The owning key's secret; the server's (BATCHINFER_WEBHOOK_SECRET) for a batch no key owns or a key
    that has none (a batch-level webhook_url of a key made without --webhook)."""
    if owner_id is not None:
        with ctx.sessions() as session:
            key = session.get(ApiKey, owner_id)
        if key is not None and key.webhook_secret:
            return key.webhook_secret
    return ctx.settings.webhook_secret


def post(ctx: AppContext, claim: Claim, body: bytes, hdrs: dict[str, str]) -> tuple[int, str]:
    """(the receiver's HTTP status, or 0 and why there was none)."""
    s = ctx.settings
    try:
        return webhook_http.post(claim.url, body, hdrs, s.webhook_timeout_s, s.webhook_allow_private), ""
    except UnsafeTarget as exc:
        return 0, f"not sent: {exc}"
    except Exception as exc:  # a URL that cannot be sent, a refused connection, a timeout: this event's failure
        return 0, f"no answer ({one_line(exc)[:200]})"


def deliver(ctx: AppContext, claim: Claim) -> bool:
    secret = signing_secret(ctx, claim.owner_id)
    if secret is None:
        _record_failure(ctx, claim, "no signing secret: set BATCHINFER_WEBHOOK_SECRET or the key's webhook")
        return False
    body = claim.body.encode()
    status, why = post(ctx, claim, body, headers(secret, claim.id, body))
    if 200 <= status < 300:
        return _record_success(ctx, claim)
    _record_failure(ctx, claim, f"HTTP {status}" if status else why)
    return False


def _record_success(ctx: AppContext, claim: Claim) -> bool:
    with transaction(ctx.sessions) as session:
        result = session.execute(update(WebhookEvent).where(WebhookEvent.id == claim.id,
                                                            WebhookEvent.status == WebhookStatus.PENDING)
                                 .values(status=WebhookStatus.DELIVERED, delivered_at=time.time(), last_error=None))
    return result.rowcount == 1


def _record_failure(ctx: AppContext, claim: Claim, error: str) -> None:
    s, now = ctx.settings, time.time()
    delay = min(s.webhook_backoff_s * 2 ** (claim.attempts - 1), s.webhook_max_backoff_s)
    gave_up = now + delay > claim.created_at + s.webhook_max_age_s
    values = {"last_error": error[:500], "next_attempt_at": now + delay}
    if gave_up:
        values["status"] = WebhookStatus.FAILED
    with transaction(ctx.sessions) as session:  # only the latest claimant writes (a stale lease does not)
        session.execute(update(WebhookEvent).where(WebhookEvent.id == claim.id, WebhookEvent.attempts == claim.attempts,
                                                   WebhookEvent.status == WebhookStatus.PENDING).values(**values))
    log.log(logging.ERROR if gave_up else logging.INFO, "webhook %s to %r: %s (attempt %d%s)", claim.id, claim.url,
            error, claim.attempts, ", giving up" if gave_up else f", retry in {delay:.0f} s")


def deliver_due(ctx: AppContext, now: float | None = None) -> int:
    """One pass: deliver every event that is due now; the number delivered."""
    claims = claim_due(ctx, time.time() if now is None else now)
    return sum(_deliver_alone(ctx, c) for c in claims)


def _deliver_alone(ctx: AppContext, claim: Claim) -> bool:
    """One event's trouble stays its own: the others of the pass are delivered all the same."""
    try:
        return deliver(ctx, claim)
    except Exception as exc:
        if is_transient(exc):
            raise  # the database is down: the whole pass waits for the next tick
        log.warning("webhook %s could not be delivered: %s", claim.id, one_line(exc))
        return False


class DeliveryLoop:
    """A thread of the worker process that delivers the outbox every webhook_poll_s: never in a unit's path."""

    def __init__(self, ctx: AppContext):
        self.ctx = ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchinfer-webhooks", daemon=True)

    def start(self) -> DeliveryLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.ctx.settings.webhook_timeout_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.ctx.settings.webhook_poll_s):
            try:
                deliver_due(self.ctx)
            except Exception as exc:  # the database may be down a while: try again next tick
                if is_transient(exc):
                    log.warning("webhook delivery pass: %s; will retry", one_line(exc))
                else:
                    log.warning("webhook delivery pass failed", exc_info=True)
