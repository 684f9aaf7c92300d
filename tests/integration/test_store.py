"""hivemux.store on a real PostgreSQL: the migrator and the profile store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from hivemux.errors import TransientError
from hivemux.infra import free_port
from hivemux.store import (
    MigrationConflict,
    ModelRecord,
    ModelStore,
    ProfileRecord,
    ProfileStore,
    connect,
    load_migrations,
    migrate,
)
from hivemux.store.migrate import MIGRATION_LOCK_KEY

pytestmark = pytest.mark.integration

AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def make_profile(job_id: str = "job-1", *, signature: str = "sig-abcdef01", at: datetime = AT) -> ProfileRecord:
    return ProfileRecord(
        job_id=job_id,
        signature=signature,
        gpu_type="A100",
        method="simulated",
        iteration_time_ms=120.5,
        gpu_util=80.0,
        sm_activity=55.0,
        sm_occupancy=30.0,
        memory_peak_mib=9000.0,
        persistent_memory_mib=2500.0,
        event_id=uuid.uuid4(),
        occurred_at=at,
    )


@pytest.fixture
async def conn(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(pg_dsn)
    yield connection
    await connection.close()


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[ProfileStore]:
    pool = await connect(pg_dsn)
    await migrate(pool)
    yield ProfileStore(pool)
    await pool.close()


def test_shipped_migrations_load_in_order() -> None:
    migrations = load_migrations()
    assert [(m.version, m.name) for m in migrations][:2] == [(1, "profiles"), (2, "predictor_models")]
    assert [m.version for m in migrations] == sorted({m.version for m in migrations})


async def test_migrations_apply_once(conn: asyncpg.Connection) -> None:
    everything = [m.version for m in load_migrations()]
    assert await migrate(conn) == everything
    assert await migrate(conn) == []
    recorded = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
    assert [(r["version"], r["name"]) for r in recorded] == [(m.version, m.name) for m in load_migrations()]
    assert await conn.fetchval("SELECT to_regclass('profiles') IS NOT NULL")
    assert await conn.fetchval("SELECT to_regclass('predictor_models') IS NOT NULL")


async def test_concurrent_migrations_apply_each_version_once(pg_dsn: str) -> None:
    connections = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in connections))
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    applied = sorted(v for result in results for v in result)
    assert applied == [m.version for m in load_migrations()]
    assert sum(1 for result in results if result) == 1  # one instance applied, the others waited


async def test_refuses_a_database_migrated_by_newer_code(conn: asyncpg.Connection, pg_dsn: str) -> None:
    await migrate(conn)
    await conn.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, 'from_the_future')")
    with pytest.raises(MigrationConflict, match="9999"):
        await migrate(conn)
    other = await asyncpg.connect(pg_dsn)
    try:  # the refusal released the migration lock: other instances are not left waiting
        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY) is True
    finally:
        await other.close()


async def test_refuses_a_known_version_recorded_under_another_name(conn: asyncpg.Connection) -> None:
    await migrate(conn)
    await conn.execute("UPDATE schema_migrations SET name = 'other_branch' WHERE version = 1")
    with pytest.raises(MigrationConflict, match="other_branch"):
        await migrate(conn)


async def test_upsert_is_idempotent(store: ProfileStore) -> None:
    profile = make_profile()
    assert await store.upsert(profile) is True
    assert await store.upsert(replace(profile, event_id=uuid.uuid4(), gpu_util=1.0)) is False
    assert await store.count() == 1
    stored = await store.get("job-1")
    assert stored is not None
    assert replace(stored, recorded_at=None) == profile  # the first write won
    assert stored.recorded_at is not None


async def test_get_unknown_job_is_none(store: ProfileStore) -> None:
    assert await store.get("nope") is None


async def test_find_by_signature_returns_the_most_recent(store: ProfileStore) -> None:
    await store.upsert(make_profile("old", at=AT))
    await store.upsert(make_profile("new", at=AT + timedelta(minutes=5)))
    await store.upsert(make_profile("other", signature="sig-99999999", at=AT + timedelta(hours=1)))
    found = await store.find_by_signature("sig-abcdef01", "A100")
    assert found is not None and found.job_id == "new"
    assert await store.find_by_signature("sig-abcdef01", "H100") is None


async def test_connect_gives_up_with_a_transient_error() -> None:
    nobody_listens = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(TransientError, match="unreachable"):
        await connect(nobody_listens, retry_for_s=0.3)


def make_model(version: int, *, published: bool = True, error: float = 0.05) -> ModelRecord:
    return ModelRecord(
        gpu_type="T4",
        version=version,
        kind="mlp",
        weights_b64="d2VpZ2h0cw==",
        parameters={"heldout_throughput_mape": error, "layers": 4.0},
        heldout_error=error,
        trained_on=1600,
        published=published,
        event_id=uuid.uuid4(),
        occurred_at=AT + timedelta(minutes=version),
    )


async def test_model_versions_are_recorded_once_and_the_latest_published_wins(pg_dsn: str) -> None:
    pool = await connect(pg_dsn)
    try:
        await migrate(pool)
        models = ModelStore(pool)
        assert await models.latest_published("T4") is None and await models.newest_version("T4") == 0
        assert await models.record(make_model(1)) is True
        assert await models.record(make_model(2)) is True
        assert await models.record(make_model(3, published=False, error=0.4)) is True  # refused: worse
        assert await models.record(make_model(2, error=0.9)) is False  # a version is written once
        latest = await models.latest_published("T4")
        assert latest is not None and latest.version == 2 and latest.heldout_error == pytest.approx(0.05)
        assert latest.parameters == {"heldout_throughput_mape": 0.05, "layers": 4.0}
        assert await models.newest_version("T4") == 3
        assert [(m.version, m.published) for m in await models.versions("T4")] == [(1, True), (2, True), (3, False)]
    finally:
        await pool.close()
