"""`batchinfer keys`: the API keys of `batchinfer serve`, one per tenant (create, list, revoke, set-org)."""
from __future__ import annotations

import json

import typer

from batchinfer.cli.common import context, friendly_errors, out, say
from batchinfer.cli.render import keys_table
from batchinfer.jobs.tenancy import tenants

keys_app = typer.Typer(no_args_is_help=True, help="API keys for `batchinfer serve` (one per tenant).")


@keys_app.command("create")
@friendly_errors
def keys_create(name: str = typer.Option(..., help="who the key is for"),
                webhook: str | None = typer.Option(None, "--webhook", help="URL that receives batch.* events"),
                admin: bool = typer.Option(False, "--admin", help="sees every batch and the workers"),
                org: str | None = typer.Option(None, "--org", help="share the prefix cache with this org's keys"),
                as_json: bool = typer.Option(False, "--json", help="print the key (with its secret) as JSON")):
    """Make an API key; its secret (and its webhook signing secret) is printed once and never shown again."""
    key, secret = tenants.create_key(context(), name, webhook_url=webhook, admin=admin, org=org)
    if as_json:
        record = {"id": key.id, "name": key.name, "key": secret, "admin": key.is_admin, "org": key.org}
        if key.webhook_url:
            record |= {"webhook_url": key.webhook_url, "webhook_secret": key.webhook_secret}
        print(json.dumps(record))
        return
    print(secret)
    if key.webhook_secret:
        print(key.webhook_secret)
    printed = "the key above and its webhook signing secret below it are" if key.webhook_secret else "the key above is"
    say(f"created {key.id} ({key.name}{', admin' if admin else ''}); {printed} shown only now")


@keys_app.command("list")
@friendly_errors
def keys_list(as_json: bool = typer.Option(False, "--json", help="print a JSON list for scripts")):
    """The API keys (never their secrets)."""
    rows = [{"id": k.id, "name": k.name, "org": k.org, "created_at": int(k.created_at),
             "revoked_at": int(k.revoked_at) if k.revoked_at else None} for k in tenants.list_keys(context())]
    if as_json:
        print(json.dumps(rows))
    else:
        out.print(keys_table(rows))


@keys_app.command("revoke")
@friendly_errors
def keys_revoke(key_id: str):
    """Revoke an API key: it gets 401 from then on."""
    key = tenants.revoke_key(context(), key_id)
    print(f"{key.id} revoked")


@keys_app.command("set-org")
@friendly_errors
def keys_set_org(key_id: str, org: str | None = typer.Argument(None, help="the org; leave out for the key's own scope")):
    """Put a key in an org: keys of one org share the prefix cache and cross-batch prefix groups. Batches
    the key creates from then on run in the org's scope; without ORG the key gets its own scope back."""
    key = tenants.set_org(context(), key_id, org)
    print(f"{key.id} is in org {key.org}" if key.org else f"{key.id} has its own cache scope")
