import pytest

from batchinfer.jobs.webhooks.signing import WebhookVerificationError, headers, new_secret, sign, verify

pytestmark = pytest.mark.fast

BODY = b'{"object":"event","id":"evt_1","type":"batch.completed","created_at":1,"data":{"id":"batch_1"}}'


def test_a_signed_event_verifies_with_its_secret():
    secret = new_secret()
    hdrs = headers(secret, "evt_1", BODY, timestamp=1_700_000_000)
    assert hdrs["webhook-signature"].startswith("v1,")
    verify(secret, hdrs, BODY, now=1_700_000_010)


def test_a_wrong_signature_is_detected():
    secret = new_secret()
    hdrs = headers(secret, "evt_1", BODY, timestamp=1_700_000_000)
    with pytest.raises(WebhookVerificationError, match="no webhook-signature matches"):
        verify(new_secret(), hdrs, BODY, now=1_700_000_000)  # another key's secret
    with pytest.raises(WebhookVerificationError):
        verify(secret, hdrs, BODY.replace(b"completed", b"cancelled"), now=1_700_000_000)  # body changed
    with pytest.raises(WebhookVerificationError):
        verify(secret, {**hdrs, "webhook-id": "evt_2"}, BODY, now=1_700_000_000)  # id changed


def test_an_old_timestamp_or_missing_header_is_refused():
    secret = new_secret()
    hdrs = headers(secret, "evt_1", BODY, timestamp=1_700_000_000)
    with pytest.raises(WebhookVerificationError, match="too far"):
        verify(secret, hdrs, BODY, now=1_700_000_000 + 3600)
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(secret, {"webhook-id": "evt_1"}, BODY)


def test_the_signature_is_standard_webhooks():
    # the reference vector of the Standard Webhooks spec (github.com/standard-webhooks/standard-webhooks)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == \
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
