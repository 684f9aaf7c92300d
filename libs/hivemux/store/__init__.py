"""PostgreSQL access through asyncpg: connection pools, the schema migrator, the profile store
and the speed-model store.

A service owns its tables (services never share one, STYLE.md §3); it calls `connect(dsn)`
and `migrate(pool)` at startup, then builds its store over the pool.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential

from hivemux.errors import TransientError
from hivemux.store.migrate import Migration, MigrationConflict, load_migrations, migrate
from hivemux.store.models import ModelRecord, ModelStore
from hivemux.store.profiles import ProfileRecord, ProfileStore

__all__ = [
    "Migration",
    "MigrationConflict",
    "ModelRecord",
    "ModelStore",
    "ProfileRecord",
    "ProfileStore",
    "connect",
    "load_migrations",
    "migrate",
]

# Failures that a server still starting (or briefly overloaded) produces; anything else (bad
# credentials, unknown database) is configuration and is raised at once.
_TRANSIENT = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ConnectionDoesNotExistError,
)


async def connect(dsn: str, *, retry_for_s: float = 5.0, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool on `dsn`, retried with backoff for `retry_for_s` (databases start with their services).

    Raises `TransientError` when the server is still unreachable after that, so the caller's
    startup can report or retry it like any other transient failure.
    """
    retrying = AsyncRetrying(
        stop=stop_after_delay(retry_for_s),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        retry=retry_if_exception_type(_TRANSIENT),
    )

    async def create() -> asyncpg.Pool:
        # awaited here: tenacity calls a plain function (create_pool) without awaiting its result
        return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)

    try:
        pool: asyncpg.Pool = await retrying(create)
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise TransientError(f"PostgreSQL at {_redacted(dsn)} unreachable for {retry_for_s:g}s: {cause!r}") from cause
    return pool


def _redacted(dsn: str) -> str:
    """The DSN without its password, for error messages and logs."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
