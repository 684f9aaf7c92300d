"""A minimal schema migrator for PostgreSQL over asyncpg.

Why not alembic: alembic is built on SQLAlchemy (engines, dialects, its own connection layer),
and hivemux talks to PostgreSQL through asyncpg only. What a service needs at startup is
small: apply the SQL files it ships, in order, exactly once, even when several instances of
the service start at the same moment. That is this module.

Migrations are the package's `store/migrations/NNNN_name.sql` files (package data, read with
`importlib.resources`, so they ship inside a wheel). Applied ones are recorded in

    schema_migrations(version int PRIMARY KEY, name text, applied_at timestamptz DEFAULT now())

`migrate()` holds a session-level `pg_advisory_lock` on one fixed key for the whole run, so
concurrent callers on the same database serialize: the first applies, the others then find
nothing pending. Each migration runs in its own transaction together with its
`schema_migrations` row, so a failed file leaves neither half its changes nor a record.

It refuses to run (`MigrationConflict`) when the database was migrated by newer code (a
version this code does not know) or a known version was recorded under another name (two
branches used the same number): continuing would run code against a schema it does not
understand. Versions missing below the newest applied one (a migration merged late) are
applied in version order.

Example: a fresh database and files 0001_profiles.sql, 0002_models.sql -> `[1, 2]`; the next
call -> `[]`.
"""

from __future__ import annotations

import importlib.resources
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from hivemux.errors import ConfigurationError

log = logging.getLogger("hivemux.store.migrate")

# pg_advisory_lock key for "hivemux schema migrations": the ASCII bytes of "hvmxmigr" as a bigint.
MIGRATION_LOCK_KEY = int.from_bytes(b"hvmxmigr", "big", signed=True)

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy


class MigrationConflict(ConfigurationError):
    """The database's recorded migrations contradict the ones this code ships."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(folder: Traversable | None = None) -> tuple[Migration, ...]:
    """The migrations shipped in `hivemux.store/migrations`, sorted by version."""
    root = folder if folder is not None else importlib.resources.files("hivemux.store").joinpath("migrations")
    found: list[Migration] = []
    for entry in root.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise ConfigurationError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        found.append(Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8")))
    return _checked(found)


async def migrate(conn_or_pool: Connection | asyncpg.Pool, migrations: Sequence[Migration] | None = None) -> list[int]:
    """Apply pending migrations in version order; return the versions applied (empty if none)."""
    known = _checked(migrations) if migrations is not None else load_migrations()
    if isinstance(conn_or_pool, asyncpg.Pool):
        async with conn_or_pool.acquire() as conn:
            return await _migrate(conn, known)
    return await _migrate(conn_or_pool, known)


async def _migrate(conn: Connection, known: tuple[Migration, ...]) -> list[int]:
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        rows = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        applied: dict[int, str] = {row["version"]: row["name"] for row in rows}
        _refuse_conflicts(applied, known)
        done: list[int] = []
        for migration in known:
            if migration.version in applied:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            fields = {"version": migration.version, "migration": migration.name}
            log.info("applied migration %04d_%s", migration.version, migration.name, extra=fields)
            done.append(migration.version)
        return done
    finally:
        if not conn.is_closed():  # a closed session has released its lock already
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


def _refuse_conflicts(applied: dict[int, str], known: tuple[Migration, ...]) -> None:
    names = {m.version: m.name for m in known}
    unknown = sorted(v for v in applied if v not in names)
    if unknown:
        raise MigrationConflict(
            f"database has migrations {unknown} that this code does not know (newest known: "
            f"{max(names, default=0)}); it was migrated by newer code, refusing to run"
        )
    renamed = [(v, applied[v], names[v]) for v in sorted(applied) if applied[v] != names[v]]
    if renamed:
        detail = ", ".join(f"{v}: database {db!r} vs code {code!r}" for v, db, code in renamed)
        raise MigrationConflict(f"migration names differ ({detail}); refusing to run")


def _checked(migrations: Sequence[Migration]) -> tuple[Migration, ...]:
    ordered = tuple(sorted(migrations, key=lambda m: m.version))
    versions = [m.version for m in ordered]
    if len(set(versions)) != len(versions):
        raise ConfigurationError(f"duplicate migration versions in {versions}")
    if versions and versions[0] <= 0:
        raise ConfigurationError("migration versions start at 1")
    return ordered
