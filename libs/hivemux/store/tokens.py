"""The HTTP API's bearer tokens in PostgreSQL (migration 0007), kept hashed.

A token reads ``hmx_<token id>_<secret>``: the id (8 hex digits) names it in lists, in
revocations and in the principal its commands carry (``<tenant>:<token id>``); the secret is 32
random bytes (``secrets.token_urlsafe``). Only ``sha256(token)`` is stored, so a copy of the
table lets nobody act: a token with that much entropy needs no slow hash (guessing 256 bits is
hopeless, and a fast hash keeps every request's lookup one indexed read).

A tenant token acts on the jobs of its VCs (`Principal.may_act_on`); an admin token on every
VC, and it may drain GPUs and publish cell configurations. A revoked token is refused at once
(every request looks its token up; nothing is cached), and so is a token past its expiry
(``create(ttl=...)``, ``hivemux tokens create --ttl 12h``; the database's clock decides, as it
stamps ``created_at``). `authenticate` tells an expired token apart (`Refused.reason` names when
it expired: only the holder of the whole token learns it) from an unknown or revoked one.

Example: `create(tenant="acme", vcs=["vc-a"])` returns ``("1f2e3d4c", "hmx_1f2e3d4c_…")``;
`authenticate("hmx_1f2e3d4c_…")` gives ``Principal("acme", "1f2e3d4c", ("vc-a",), False)``
whose `name` is ``acme:1f2e3d4c``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from ..errors import ConfigurationError

PREFIX = "hmx_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a tenant or VC: fits events.base.Name with a token id after it
_TOKEN_ID = re.compile(rf"^{PREFIX}([0-9a-f]{{8}})_")
MAX_TTL = timedelta(days=3650)
UNKNOWN = "unknown or revoked token"


@dataclass(frozen=True)
class Principal:
    """Who a request acts for."""

    tenant: str
    token_id: str
    vcs: tuple[str, ...]
    admin: bool

    @property
    def name(self) -> str:
        """What the commands it asks for carry as `principal`."""
        return f"{self.tenant}:{self.token_id}"

    def may_act_on(self, vc: str | None) -> bool:
        return self.admin or (vc is not None and vc in self.vcs)

    def scope(self) -> tuple[str, ...] | None:
        """The VCs it may see, None: all of them."""
        return None if self.admin else self.vcs


@dataclass(frozen=True)
class TokenRecord:
    token_id: str
    tenant: str
    vcs: tuple[str, ...]
    admin: bool
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {"token_id": self.token_id, "tenant": self.tenant, "vcs": list(self.vcs), "admin": self.admin,
                "created_at": self.created_at.isoformat(), "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None}  # fmt: skip


@dataclass(frozen=True)
class Refused:
    """Why a token was not accepted (the API's 401 ``detail``)."""

    reason: str


def token_id_of(token: str) -> str | None:
    """The id a token claims (``hmx_<id>_…``), None when it has not the shape of one: what
    failed attempts against one token are counted by (`api.limits`)."""
    found = _TOKEN_ID.match(token)
    return found.group(1) if found else None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _record(row: asyncpg.Record) -> TokenRecord:
    return TokenRecord(row["token_id"], row["tenant"], tuple(row["vcs"]), row["admin"], row["created_at"], row["revoked_at"], row["expires_at"])


class TokenStore:
    """The ``api_tokens`` table through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self, *, tenant: str, vcs: Sequence[str] = (), admin: bool = False, ttl: timedelta | None = None
    ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself (shown once; only its hash is kept); with
        `ttl`, refused from ``created_at + ttl`` on."""
        for name in (tenant, *vcs):
            if not _NAME.match(name):
                raise ConfigurationError(f"{name!r} is not a tenant or VC name (letters, digits, '.', '_', '-'; at most 100)")
        if not vcs and not admin:
            raise ConfigurationError("a tenant token needs at least one VC (--vc), or --admin")
        if ttl is not None and not timedelta(seconds=1) <= ttl <= MAX_TTL:
            raise ConfigurationError(f"a token's ttl is from 1 s to {MAX_TTL.days} days, not {ttl}")
        token_id = secrets.token_hex(4)
        token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        row = await self._pool.fetchrow(
            "INSERT INTO api_tokens (token_id, secret_sha256, tenant, vcs, admin, expires_at)"
            " VALUES ($1, $2, $3, $4, $5, now() + $6::interval) RETURNING *",
            token_id, digest(token), tenant, sorted(set(vcs)), admin, ttl,
        )  # fmt: skip
        return _record(row), token

    async def list(self) -> list[TokenRecord]:
        return [_record(r) for r in await self._pool.fetch("SELECT * FROM api_tokens ORDER BY created_at, token_id")]

    async def revoke(self, token_id: str) -> TokenRecord | None:
        """Revoke a token (None: no such token); revoking a revoked one keeps its first time."""
        row = await self._pool.fetchrow(
            "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = $1 RETURNING *", token_id
        )
        return None if row is None else _record(row)

    async def authenticate(self, token: str) -> Principal | Refused:
        """The principal of a valid token: known, not revoked, not expired; why not otherwise."""
        if not token.startswith(PREFIX):
            return Refused(UNKNOWN)
        row = await self._pool.fetchrow(
            "SELECT token_id, tenant, vcs, admin, expires_at, expires_at <= now() AS expired FROM api_tokens"
            " WHERE secret_sha256 = $1 AND revoked_at IS NULL",
            digest(token),
        )
        if row is None:
            return Refused(UNKNOWN)
        if row["expired"]:
            return Refused(f"token {row['token_id']} expired at {row['expires_at'].isoformat(timespec='seconds')}: ask for a new one (hivemux tokens create)")
        return Principal(row["tenant"], row["token_id"], tuple(row["vcs"]), row["admin"])
