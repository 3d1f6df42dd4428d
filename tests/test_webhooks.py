"""Webhooks end to end on PostgreSQL: ended batches put one event each in the outbox, delivery signs
them, retries a failing receiver with backoff, and records one success per event even when several
workers deliver at once."""
import json
import threading
import time
import uuid

import pytest
from sqlalchemy import select

from batchinfer.db.models import Job, JobStatus, WebhookEvent
from batchinfer.db.session import transaction
from batchinfer.errors import InvalidRequest
from batchinfer.jobs import service
from batchinfer.jobs.intake.validate_job import validate_job
from batchinfer.jobs.webhooks.delivery import DeliveryLoop, deliver_due
from batchinfer.jobs.webhooks.events import event_id, record_final
from batchinfer.jobs.webhooks.signing import WebhookVerificationError, new_secret, verify
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.units.runner import run_unit
from jobfiles import completion_line, submit_lines
from webhook_receiver import Receiver

SECRET = new_secret()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def pg_context(make_context, postgres_url):
    def make(**overrides):
        return make_context(database_url=postgres_url, webhook_secret=SECRET, webhook_backoff_s=0.2,
                            webhook_poll_s=0.1, **{"webhook_allow_private": True, **overrides})  # the receiver is on loopback
    return make


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_each_ended_batch_gets_one_signed_event_through_a_failing_receiver(pg_context, receiver, generator):
    ctx = pg_context()
    hook = {"webhook_url": receiver.url}
    done = submit_lines(ctx, [completion_line("a", "The sky is")], metadata=hook)
    failed = submit_lines(ctx, ["{oops"], metadata=hook)
    cancelled = service.cancel(ctx, submit_lines(ctx, [completion_line("b", "Hi")], metadata=hook).id)
    submit_lines(ctx, [completion_line("c", "No hook")])  # no receiver: no event
    for unit in dispatch(ctx):
        run_unit(ctx, unit.unit_id, generator, "test-worker")
    assert service.get(ctx, done.id).status == JobStatus.COMPLETED

    receiver.refuse = {event_id(done.id): 2}  # the completed batch's event is refused twice
    loop = DeliveryLoop(ctx).start()
    try:
        _wait_for(lambda: len(receiver.acknowledged()) == 3)
        time.sleep(0.5)  # nothing more arrives
    finally:
        loop.stop()

    events = {}
    for got in receiver.received:
        verify(SECRET, got.headers, got.body)
        event = json.loads(got.body)
        assert got.headers["webhook-id"] == event["id"]
        events.setdefault(event["data"]["id"], []).append((event["type"], got.answered))
    assert sorted(events) == sorted([done.id, failed.id, cancelled.id])
    assert {job: {t for t, _ in got} for job, got in events.items()} == {
        done.id: {"batch.completed"}, failed.id: {"batch.failed"}, cancelled.id: {"batch.cancelled"}}
    assert [a for _, a in events[done.id]] == [500, 500, 200]
    assert [a for _, a in events[failed.id]] == [a for _, a in events[cancelled.id]] == [200]
    with ctx.sessions() as session:
        rows = list(session.scalars(select(WebhookEvent)))
    assert sorted((r.status, r.attempts) for r in rows) == [("delivered", 1), ("delivered", 1), ("delivered", 3)]


def test_concurrent_deliverers_record_one_success_per_event(pg_context, receiver):
    ctx = pg_context()
    now = time.time()
    with transaction(ctx.sessions) as session:
        for i in range(12):
            job = Job(id=f"batch_{i:04d}", status=JobStatus.COMPLETED, model="m", completion_window_s=60,
                      created_at=now, expires_at=now + 60, metadata_={"webhook_url": receiver.url})
            session.add(job)
            record_final(session, job, now)
    threads = [threading.Thread(target=deliver_due, args=(ctx,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert sorted(ids) == sorted(f"evt_{i:04d}" for i in range(12))  # each once: claims skip locked rows
    assert deliver_due(ctx) == 0


def test_a_receiver_that_never_answers_is_given_up_after_max_age(pg_context, receiver):
    ctx = pg_context(webhook_max_age_s=0.5)
    receiver.answers = [503] * 100
    job = submit_lines(ctx, ["{oops"], metadata={"webhook_url": receiver.url})
    deadline = time.time() + 10
    while time.time() < deadline:
        deliver_due(ctx)
        with ctx.sessions() as session:
            event = session.scalar(select(WebhookEvent).where(WebhookEvent.job_id == job.id))
        if event.status == "failed":
            break
        time.sleep(0.1)
    assert event.status == "failed" and event.last_error == "HTTP 503" and event.attempts >= 2
    assert not receiver.acknowledged()


def test_a_bad_webhook_url_is_refused_at_submit(pg_context):
    with pytest.raises(InvalidRequest, match="invalid webhook URL"):
        submit_lines(pg_context(), [completion_line("a", "x")], metadata={"webhook_url": "file:///etc/passwd"})


def test_a_keys_webhook_gets_its_batches_events_signed_with_the_keys_secret(pg_context, receiver):
    import io

    from batchinfer.jobs.tenancy import tenants

    ctx = pg_context()
    key, _ = tenants.create_key(ctx, "team", webhook_url=receiver.url)
    job = service.create_job(ctx, owner_id=key.id)
    ctx.storage.upload(job.input_key, io.BytesIO(b"{oops\n"))
    assert validate_job(ctx, job.id).status == JobStatus.FAILED
    assert deliver_due(ctx) == 1
    (got,) = receiver.received
    verify(key.webhook_secret, got.headers, got.body)
    assert json.loads(got.body)["type"] == "batch.failed"
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, got.headers, got.body)  # the server's secret is not the key's


def _events_to(ctx, urls: list[str], owner: str | None = None) -> list[str]:
    """Ended batches whose events go to `urls`, written past the creation-time check (as an old row or a
    receiver whose DNS changed would be): their event ids."""
    now = time.time()
    with transaction(ctx.sessions) as session:
        for url in urls:
            job = Job(id=f"batch_{uuid.uuid4().hex}", status=JobStatus.COMPLETED, model="m", completion_window_s=60,
                      created_at=now, expires_at=now + 60, owner_id=owner, metadata_={"webhook_url": url})
            session.add(job)
            record_final(session, job, now)
            now += 0.001  # claimed in this order
    with ctx.sessions() as session:
        return [e.id for e in session.scalars(select(WebhookEvent).order_by(WebhookEvent.next_attempt_at))]


def test_webhooks_to_addresses_inside_never_leave_the_server(pg_context, receiver):  # finding 9
    import socket

    port = receiver.url.split(":")[2].split("/")[0]
    name = socket.gethostname()
    inside = [f"http://127.0.0.1:{port}/hook", f"http://0x7f000001:{port}/hex", f"http://2130706433:{port}/dec",
              f"http://[::1]:{port}/", "http://169.254.169.254/latest/meta-data"]
    if any(info[4][0].startswith("127.") for info in socket.getaddrinfo(name, 80)):
        inside.append(f"http://{name}:{port}/dns")  # a DNS name that resolves inside
    ctx = pg_context(webhook_allow_private=False)
    _events_to(ctx, inside)
    assert deliver_due(ctx) == 0
    with ctx.sessions() as session:
        errors = [e.last_error for e in session.scalars(select(WebhookEvent))]
    assert len(errors) == len(inside) and all(e.startswith("not sent: ") for e in errors), errors
    assert receiver.received == []
    for url in inside[:3]:
        with pytest.raises(InvalidRequest, match="not a public address"):
            submit_lines(ctx, [completion_line("a", "x")], metadata={"webhook_url": url})


def test_an_event_that_cannot_be_sent_fails_alone_and_never_blocks_others(pg_context, receiver):  # finding 7
    ctx = pg_context(webhook_max_age_s=0.5)
    bad, good = _events_to(ctx, [receiver.url.replace("/hook", "/a b"), receiver.url], owner=None)
    assert deliver_due(ctx) == 1
    assert [json.loads(r.body)["id"] for r in receiver.acknowledged()] == [good]
    deadline = time.time() + 10
    while time.time() < deadline:
        deliver_due(ctx)
        with ctx.sessions() as session:
            event = session.get(WebhookEvent, bad)
        if event.status == "failed":
            break
        time.sleep(0.1)
    assert event.status == "failed" and event.last_error.startswith("no answer")
    assert len(receiver.received) == 1


def test_a_redirect_is_never_followed(pg_context, receiver):  # point 4: a public receiver cannot point inside
    inside = Receiver()
    try:
        receiver.answers, receiver.location = [302, 307], inside.url
        ctx = pg_context()
        _events_to(ctx, [receiver.url], owner=None)
        assert deliver_due(ctx) == 0  # a 3xx is no acknowledgement
        _wait_for(lambda: deliver_due(ctx) == 1)  # retried after its backoff: 307, then 200
        assert [r.answered for r in receiver.received] == [302, 307, 200]
        assert inside.received == []  # never followed, whatever the status
    finally:
        inside.close()


@pytest.mark.parametrize("url", ["http://example.com/a b", "http://example.com/\nX-Injected: 1",
                                 "http://example.com/\x00", "http://example.com:99999/", "http://[::1/"])
def test_webhook_urls_that_cannot_be_sent_are_refused_at_submit(pg_context, url):  # findings 7 and 12
    with pytest.raises(InvalidRequest, match="invalid webhook URL"):
        submit_lines(pg_context(), [completion_line("a", "x")], metadata={"webhook_url": url})
