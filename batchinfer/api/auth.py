"""Bearer API keys: every endpoint but the health check answers only to a live key."""
from __future__ import annotations

from fastapi import Depends, Request

from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey
from batchinfer.jobs.tenancy import tenants


def context(request: Request) -> AppContext:
    return request.app.state.ctx


def api_key(request: Request, ctx: AppContext = Depends(context)) -> ApiKey:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'.", "missing_api_key")
    key = tenants.authenticate(ctx, secret.strip())
    if key is None:
        raise APIError(401, "Incorrect or revoked API key.", "invalid_api_key")
    return key


def owner_id(key: ApiKey = Depends(api_key)) -> str:
    return key.id
