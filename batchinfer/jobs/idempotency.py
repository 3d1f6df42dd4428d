"""Idempotent creates (POST /v1/batches and /v1/files): an `Idempotency-Key` (or the create body's
`idempotency_key`) names one object per owner. The same key with the same request answers with that object, with
another request 409; the key's row commits in the object's own transaction, so of concurrent retries one makes
the object and the others answer with it."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError

from batchinfer.context import AppContext
from batchinfer.db.models import IdempotencyKey
from batchinfer.db.session import transaction
from batchinfer.errors import BatchInferError, InvalidRequest, excerpt, shown
from batchinfer.jobs.user_text import has_control

T = TypeVar("T")
MAX_KEY = 255
ATTEMPTS = 5  # a create that lost the race to a concurrent one with its key reads that one's object


class IdempotencyConflict(BatchInferError):
    """The key was used before with another request: HTTP 409."""


@dataclass(frozen=True)
class Claim:
    """A key a create is about to make its object under: the maker adds row(object_id) in its own transaction."""

    owner_id: str
    scope: str  # batches or files
    key: str
    request_hash: str

    def row(self, object_id: str) -> IdempotencyKey:
        return IdempotencyKey(owner_id=self.owner_id, scope=self.scope, key=self.key, request_hash=self.request_hash,
                              object_id=object_id, created_at=time.time())


def request_hash(request: dict) -> str:
    """A digest of what the create asks for, the same whatever the order of an object's keys."""
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def the_key(header: str | None, body: str | None) -> str | None:
    """The key from the `Idempotency-Key` header or the body's `idempotency_key` (one thing, two spellings)."""
    if header is not None and body is not None and header != body:
        raise InvalidRequest("The Idempotency-Key header and idempotency_key differ: send one key.",
                             code="invalid_value", param="idempotency_key")
    key = header if header is not None else body
    if key is not None and (not 0 < len(key) <= MAX_KEY or has_control(key)):
        raise InvalidRequest(f"Invalid value for 'idempotency_key': 1 to {MAX_KEY} characters with no control "
                             f"characters (got {shown(key)}).", code="invalid_value", param="idempotency_key")
    return key


def once(ctx: AppContext, claim: Claim, find: Callable[[str], T | None], make: Callable[[Claim], T]) -> tuple[T, bool]:
    """(the object this key made, False), or (the object `make` made now under the key, True). make adds
    claim.row(its id) in the transaction that makes its object; a maker whose key row meets a concurrent one's
    loses at the unique key and answers with that one's object. A key whose object is gone (deleted) is free again."""
    for _ in range(ATTEMPTS):
        with ctx.sessions() as session:
            row = session.get(IdempotencyKey, (claim.owner_id, claim.scope, claim.key))
        if row is not None:
            found = find(row.object_id)  # first: a key whose object is gone is free, whatever it was asked with
            if found is None:
                _free(ctx, claim)
                continue
            if row.request_hash != claim.request_hash:
                raise IdempotencyConflict(
                    f"Conflict: the idempotency key {excerpt(claim.key, 80)!r} was used before with different "
                    "parameters; use a new key, or send the same request again.")
            return found, False
        try:
            return make(claim), True
        except IntegrityError:  # a concurrent create with this key committed first: answer with its object
            continue
    raise BatchInferError("the idempotency key is contended: try again")


def _free(ctx: AppContext, claim: Claim) -> None:
    with transaction(ctx.sessions) as session:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.owner_id == claim.owner_id,
                                                     IdempotencyKey.scope == claim.scope,
                                                     IdempotencyKey.key == claim.key))
