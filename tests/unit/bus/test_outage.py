"""`bus.outage.is_outage`: the database's own "not now" answers are outages, a bad query is not."""

from __future__ import annotations

import asyncpg
import pytest

from hivemux.bus.outage import is_outage


@pytest.mark.parametrize(
    "error",
    [
        # what a restarted PostgreSQL answers during its crash recovery (SQLSTATE 57P03)
        asyncpg.exceptions.CannotConnectNowError("the database system is not yet accepting connections"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.exceptions.CrashShutdownError("terminating connection because of crash of another server process"),
        asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        ConnectionRefusedError(111, "Connect call failed"),
    ],
)
def test_the_database_unavailable_is_an_outage(error: BaseException) -> None:
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.UniqueViolationError("duplicate key value violates unique constraint"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        ValueError("a bad record"),
    ],
)
def test_a_failing_statement_is_not(error: BaseException) -> None:
    assert not is_outage(error)
