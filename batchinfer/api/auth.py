"""Bearer API keys: every /v1 endpoint answers only to a live key. The guard (api/guard.py) checks the key
from the headers before anything reads the body; endpoints take the key it found."""
from __future__ import annotations

from fastapi import Depends, Request

from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey

MISSING = (401, "Missing API key: send 'Authorization: Bearer <key>'.", "missing_api_key")
INVALID = (401, "Incorrect or revoked API key.", "invalid_api_key")


def bearer(header: str) -> str | None:
    """The secret of an `Authorization: Bearer <secret>` header, or None."""
    scheme, _, secret = header.partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def context(request: Request) -> AppContext:
    return request.app.state.ctx


def api_key(request: Request) -> ApiKey:
    key = getattr(request.state, "api_key", None)
    if key is None:  # only a path the guard does not cover could get here
        raise APIError(*MISSING)
    return key


def owner_id(key: ApiKey = Depends(api_key)) -> str:
    return key.id
