"""Telling an outage (the broker or the database unreachable) from a bad record.

A record whose handler fails because PostgreSQL or the broker is down is not a bad record:
dead-lettering it would turn every outage into lost work. These errors make the runtime pause
and retry the same record until the dependency is back (`Service` in `runtime.py`).
"""

from __future__ import annotations

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from ..errors import Outage


def is_outage(error: BaseException) -> bool:
    if isinstance(error, Outage | ConnectionError | TimeoutError | KafkaConnectionError | KafkaTimeoutError):
        return True
    if isinstance(error, KafkaError):
        return bool(getattr(error, "retriable", False))
    if isinstance(error, OSError):
        return True  # refused, reset, unreachable: the network, not the record
    try:
        import asyncpg  # only the services with a database have it loaded
    except ImportError:  # pragma: no cover - a dependency of the project
        return False
    connection_errors = (
        asyncpg.PostgresConnectionError,
        # A server full, starting up, in crash recovery or shutting down (SQLSTATE 53300, 57P01-57P03:
        # not connection errors to asyncpg): a restarted PostgreSQL answers "not yet accepting
        # connections" until its recovery is done (the profiler dead-lettered a job's submission then).
        asyncpg.exceptions.TooManyConnectionsError,
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.AdminShutdownError,
        asyncpg.exceptions.CrashShutdownError,
        asyncpg.exceptions.ConnectionDoesNotExistError,  # the connection closed under the query
        # A server killed mid-protocol leaves the client's state machine lost ("cannot switch
        # to state 11"): the connection is gone, not the record bad (seen killing PostgreSQL).
        asyncpg.exceptions.InternalClientError,
    )
    return isinstance(error, connection_errors)
