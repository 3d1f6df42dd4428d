"""API keys: each key is a tenant. Only a SHA-256 of the secret is stored; the secret is shown once."""
from __future__ import annotations

import hashlib
import secrets
import time
import uuid

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey
from batchinfer.db.session import transaction
from batchinfer.errors import BatchInferError
from batchinfer.jobs.tenancy.scopes import check_org
from batchinfer.jobs.webhooks.target import check_url
from batchinfer.jobs.webhooks.signing import new_secret

KEY_PREFIX = "sk-bi-"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(ctx: AppContext, name: str, webhook_url: str | None = None, admin: bool = False,
               org: str | None = None) -> tuple[ApiKey, str]:
    """The new key's row and its secret (the only time the secret exists outside the caller). A key with a
    webhook URL also gets a webhook signing secret (key.webhook_secret), to be shown once too. A key in an
    org shares its cache scope with the org's other keys (jobs.tenancy.scopes); without one it has its own."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(id=f"key_{uuid.uuid4().hex[:16]}", name=name, key_hash=hash_key(secret), created_at=time.time(),
                 webhook_url=check_url(webhook_url, ctx.settings.webhook_allow_private) if webhook_url else None,
                 webhook_secret=new_secret() if webhook_url else None, is_admin=admin,
                 org=check_org(org) if org else None)
    with transaction(ctx.sessions) as session:
        session.add(key)
    return key, secret


def list_keys(ctx: AppContext) -> list[ApiKey]:
    with ctx.sessions() as session:
        return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)))


def revoke_key(ctx: AppContext, key_id: str) -> ApiKey:
    with transaction(ctx.sessions) as session:
        key = session.get(ApiKey, key_id)
        if key is None:
            raise BatchInferError(f"no API key {key_id!r}")
        key.revoked_at = key.revoked_at or time.time()
    return key


def set_org(ctx: AppContext, key_id: str, org: str | None) -> ApiKey:
    """Move a key into an org (None: back to its own scope); batches it creates from then on run there."""
    with transaction(ctx.sessions) as session:
        key = session.get(ApiKey, key_id)
        if key is None:
            raise BatchInferError(f"no API key {key_id!r}")
        key.org = check_org(org) if org else None
    return key


def authenticate(ctx: AppContext, secret: str) -> ApiKey | None:
    """The live key with this secret, or None (unknown and revoked keys look the same)."""
    with ctx.sessions() as session:
        key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    return key if key is not None and key.revoked_at is None else None
