"""`hivemux tokens create | list | revoke`: the HTTP API's bearer tokens, in PostgreSQL
(HIVEMUX_POSTGRES_DSN, `store.tokens`: only each token's SHA-256 is kept, so `create` shows the
token this once). ``create --ttl 12h``: the token is refused from then on (401, "expired")."""

from __future__ import annotations

import json

import click

from ..errors import ConfigurationError
from ..store.tokens import TokenStore
from .read_model_io import run_on_read_models
from .vc_views import parse_duration


@click.group(name="tokens")
def tokens_group() -> None:
    """Bearer tokens of the HTTP API: a tenant's (its VCs' jobs) or an admin's."""


@tokens_group.command("create")
@click.option("--tenant", required=True, help="Who the token is for (shown as the principal, tenant:token-id).")
@click.option("--vc", "vcs", multiple=True, help="A VC whose jobs it may act on (repeatable).")
@click.option("--admin", is_flag=True, help="Acts on every VC, may drain GPUs and publish cell configurations.")
@click.option("--ttl", default=None, help="Expires this long after now: 90s, 30m, 12h, 30d (default: never).")
@click.option("--json", "as_json", is_flag=True)
def create(tenant: str, vcs: tuple[str, ...], admin: bool, ttl: str | None, as_json: bool) -> None:
    """Create a token and print it (only its hash is stored: keep it now)."""
    lifetime = None if ttl is None else parse_duration(ttl)
    if ttl is not None and lifetime is None:
        raise click.BadParameter(f"{ttl!r} is not a duration like 90s, 30m, 12h or 30d", param_hint="--ttl")
    try:
        record, token = run_on_read_models(lambda pool: TokenStore(pool).create(tenant=tenant, vcs=vcs, admin=admin, ttl=lifetime))
    except ConfigurationError as error:
        raise click.ClickException(str(error)) from error
    if as_json:
        click.echo(json.dumps({**record.to_json(), "token": token}))
        return
    scope = "admin" if record.admin else "VCs " + ", ".join(record.vcs)
    expiry = f", expires {record.expires_at.isoformat(timespec='seconds')}" if record.expires_at else ""
    click.echo(f"token {record.token_id} for {record.tenant} ({scope}{expiry}):\n{token}")


@tokens_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token.")
def list_tokens(as_json: bool) -> None:
    """Every token: id, tenant, VCs, admin, created, revoked, expires (never the secret)."""
    records = run_on_read_models(lambda pool: TokenStore(pool).list())
    if as_json:
        for r in records:
            click.echo(json.dumps(r.to_json()))
        return
    click.echo(f"{'id':<10} {'tenant':<16} {'admin':<6} {'created':<26} {'revoked':<26} {'expires':<26} vcs")
    for r in records:
        revoked = r.revoked_at.isoformat(timespec="seconds") if r.revoked_at else "-"
        expires = r.expires_at.isoformat(timespec="seconds") if r.expires_at else "-"
        click.echo(f"{r.token_id:<10} {r.tenant:<16} {'yes' if r.admin else 'no':<6} {r.created_at.isoformat(timespec='seconds'):<26} "
                   f"{revoked:<26} {expires:<26} {','.join(r.vcs) or '-'}")  # fmt: skip
    if not records:
        click.echo("(no tokens)")


@tokens_group.command("revoke")
@click.argument("token_id")
def revoke(token_id: str) -> None:
    """Revoke a token: the API refuses it from the next request on."""
    record = run_on_read_models(lambda pool: TokenStore(pool).revoke(token_id))
    if record is None:
        raise click.ClickException(f"no token {token_id}")
    click.echo(f"revoked {token_id} ({record.tenant})")
