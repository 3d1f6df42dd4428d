"""Standard Webhooks signatures (the scheme OpenAI's webhooks use): HMAC-SHA256 over
`{webhook-id}.{webhook-timestamp}.{body}` with a `whsec_<base64>` secret, sent as `v1,<base64>`."""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

SECRET_PREFIX = "whsec_"
TOLERANCE_S = 300  # a receiver refuses timestamps further off than this (replays)


class WebhookVerificationError(ValueError):
    pass


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return raw.encode()  # a plain passphrase (BATCHINFER_WEBHOOK_SECRET may be one)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    content = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), content, hashlib.sha256).digest()).decode()


def headers(secret: str, msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, msg_id, timestamp, body), "content-type": "application/json"}


def verify(secret: str, received: dict[str, str], body: bytes, now: float | None = None) -> None:
    """Raise WebhookVerificationError unless one of the signatures matches and the timestamp is recent."""
    lowered = {k.lower(): v for k, v in received.items()}
    try:
        msg_id, timestamp = lowered["webhook-id"], int(lowered["webhook-timestamp"])
        signatures = lowered["webhook-signature"].split()
    except (KeyError, ValueError) as exc:
        raise WebhookVerificationError(f"missing or malformed webhook header: {exc}") from None
    now = time.time() if now is None else now
    if abs(now - timestamp) > TOLERANCE_S:
        raise WebhookVerificationError("webhook-timestamp is too far from now")
    expected = sign(secret, msg_id, timestamp, body)
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise WebhookVerificationError("no webhook-signature matches")
