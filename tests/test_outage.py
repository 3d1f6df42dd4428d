"""The outage policy's parts on SQLite and local files (the real outages are in tests/faults/test_fault_outages.py):
what counts as an outage of which service, the bounded wait, and the health board the Batch object shows."""
from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError

from batchinfer.db.models import ServiceOutage as OutageRow
from batchinfer.jobs import outage
from batchinfer.jobs.faults import service_of
from batchinfer.jobs.units.live import with_live
from batchinfer.jobs.views.batch_view import batch_object
from jobfiles import completion_line, submit_lines

pytestmark = pytest.mark.fast


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_infrastructure_faults_are_outages_of_their_service_and_request_faults_are_not():
    assert service_of(EndpointConnectionError(endpoint_url="http://s3")) == "storage"
    assert service_of(_client_error(503, "ServiceUnavailable")) == "storage"
    assert service_of(_client_error(400, "SlowDown")) == "storage"  # throttling
    assert service_of(OperationalError("SELECT 1", {}, Exception("connection refused"))) == "database"
    assert service_of(RedisConnectionError("refused")) == "broker"
    for not_an_outage in (_client_error(403, "AccessDenied"), _client_error(404, "NoSuchKey"), FileNotFoundError("k"),
                          ValueError("seed out of range")):
        assert service_of(not_an_outage) is None, not_an_outage


def test_a_step_waits_out_a_short_outage_and_gives_up_past_the_bound(make_context):
    ctx = make_context(outage_retry_s=1.5, outage_backoff_s=0.2)
    tries = []

    def flaky():
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise EndpointConnectionError(endpoint_url="http://s3")
        return "stored"

    assert outage.wait_out(ctx, "storage", flaky, "a test step") == "stored" and len(tries) == 3

    def down():
        raise EndpointConnectionError(endpoint_url="http://s3")

    started = time.monotonic()
    with pytest.raises(outage.ServiceOutage) as gave_up:
        outage.wait_out(ctx, "storage", down, "a test step")
    assert gave_up.value.service == "storage" and time.monotonic() - started < 1.5 + 1.0
    with pytest.raises(ValueError):  # not an outage: raised at once
        outage.wait_out(ctx, "storage", lambda: (_ for _ in ()).throw(ValueError("bad")), "a test step")


def test_an_unfinished_batch_shows_what_it_waits_for_until_the_service_answers(make_context):
    ctx = make_context()
    job = submit_lines(ctx, [completion_line("a", "Hello")])
    assert batch_object(with_live(ctx, [job])[0])["waiting_for"] is None
    outage._seen.written.clear()
    outage.report_down(ctx, "storage", EndpointConnectionError(endpoint_url="http://s3"))
    shown = batch_object(with_live(ctx, [job])[0])
    assert shown["waiting_for"] == ["storage"] and shown["waiting_since"] is not None
    assert shown["status"] == job.status and shown["object"] == "batch"  # OpenAI's fields as they were
    assert outage.probe(ctx, "storage", wait_s=10)  # local files answer: the probe ends the outage
    assert batch_object(with_live(ctx, [job])[0])["waiting_for"] is None
    with ctx.sessions() as session:
        row = session.get(OutageRow, "storage")
    assert (row.outages, row.down_since) == (1, None) and row.down_s >= 0
