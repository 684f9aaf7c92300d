"""Shared fixtures: one embedded broker + PostgreSQL per session, a fresh database per test.

`KAFKA_BOOTSTRAP_SERVERS` / `HIVEMUX_POSTGRES_DSN` point the suite at running servers instead
(for example those printed by `python -m hivemux.infra`); nothing is started then.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.salus import grpc_setup

# The suite loads grpcio (the Salus gate, the cells inspect server) and forks processes, as the
# executor agent does: gRPC's fork handlers off here too, before grpcio loads, as the gate sets
# them where it starts (a forked child could abort before its exec; `hivemux.salus.grpc_setup`).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", grpc_setup.FORK_SUPPORT)
# The embedded broker answers an idle fetch only when its wait expires, so every consumer of every
# service polls at 1/wait: 50 ms (the default, for latency) made polling most of the suite's CPU
# on 2 cores; 200 ms keeps hops well under the tests' bounds (services inherit it).
os.environ.setdefault("HIVEMUX_FETCH_MAX_WAIT_MS", "200")


def pytest_configure(config: pytest.Config) -> None:
    """The suite's signing keys (support/keys.py): every record a test publishes is signed as
    the principal its source names, and every service the tests start verifies it."""
    from support import keys

    keys.install(Path(tempfile.mkdtemp(prefix="hivemux-keys-")))


@pytest.fixture(scope="session")
def infra() -> Iterator[Endpoints]:
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


@pytest.fixture
async def pg_dsn(infra: Endpoints) -> AsyncIterator[str]:
    """A DSN to a database created for this test alone and dropped afterwards."""
    name = f"test_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(infra.postgres_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield urlsplit(infra.postgres_dsn)._replace(path=f"/{name}").geturl()
    admin = await asyncpg.connect(infra.postgres_dsn)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()
