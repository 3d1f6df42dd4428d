"""Cache scopes: who may share prefix-cache blocks, prefix groups and work units.

A job is created in one scope and keeps it: an API key's own (`key:<id>`), its organization's when an
admin put the key in one (`org:<name>`), and for direct jobs (the local CLI, the database) `local`, or
the org that BATCHINFER_DIRECT_JOB_ORG names. The planner never mixes scopes in a unit or a group, and
the engine salts its block hashes with the scope, so nothing one scope runs shows in another's cached
tokens, timings or prefix groups.
"""
from __future__ import annotations

from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey
from batchinfer.errors import BatchInferError
from batchinfer.settings import ORG_NAME

LOCAL = "local"


def check_org(name: str) -> str:
    if not ORG_NAME.fullmatch(name):
        raise BatchInferError(f"invalid org name {name[:70]!r}: use 1-64 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit")
    return name


def org_scope(org: str) -> str:
    return f"org:{org}"


def key_scope(key: ApiKey) -> str:
    return org_scope(key.org) if key.org else f"key:{key.id}"


def job_scope(ctx: AppContext, owner_id: str | None) -> str:
    """The scope a new job of this owner (None: a direct job) runs in."""
    if owner_id is None:
        org = ctx.settings.direct_job_org
        return org_scope(org) if org else LOCAL
    with ctx.sessions() as session:
        key = session.get(ApiKey, owner_id)
    return key_scope(key) if key is not None else f"key:{owner_id}"
