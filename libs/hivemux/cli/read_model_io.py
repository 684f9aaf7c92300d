"""Running a CLI command's read-model work: one place that turns a missing or unreachable
database into a one-line error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import click

from ..errors import TransientError
from ..settings import ServiceSettings

T = TypeVar("T")


def run_on_read_models(work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    """Run `work` on a pool over HIVEMUX_POSTGRES_DSN (migrated); clear errors, no traceback."""
    from ..store import connect, migrate

    dsn = ServiceSettings().postgres_dsn
    if not dsn:
        raise click.ClickException("HIVEMUX_POSTGRES_DSN is not set; set it to the DSN `hivemux up` printed")

    async def run() -> T:
        pool = await connect(dsn, retry_for_s=2.0, max_size=2)
        try:
            await migrate(pool)
            return await work(pool)
        finally:
            await pool.close()

    try:
        return asyncio.run(run())
    except (TransientError, OSError, asyncpg.PostgresError) as error:
        raise click.ClickException(f"cannot read the read models at HIVEMUX_POSTGRES_DSN: {error}") from error
