"""At-least-once delivery with idempotent handlers, on the real broker and database: a
consumer killed after publishing its output but before committing re-receives the record on
restart, and its idempotent handler neither repeats its effect nor creates a second event."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import asyncpg
import pytest
from support.buskit import eventually, lifecycle, read_all, unique_topic

from hivemux.bus import Publisher, ensure_topics
from hivemux.infra import Endpoints
from hivemux.topics import JOBS_LIFECYCLE

pytestmark = pytest.mark.integration
TESTS = Path(__file__).resolve().parents[1]


async def start_consumer(infra: Endpoints, topic: str, dsn: str, group: str, *, crash: bool) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers,
        "HIVEMUX_GROUP_PREFIX": group,
        "CRASH_BEFORE_COMMIT": "1" if crash else "0",
        "PYTHONPATH": str(TESTS),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "support.crashy_consumer", topic, dsn, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )


async def test_killed_before_commit_redelivers_and_idempotent_handler_does_not_duplicate(infra: Endpoints, pg_dsn: str) -> None:
    topic = unique_topic(partitions=1)
    await ensure_topics(infra.bootstrap_servers, [topic, topic.dead_letter, JOBS_LIFECYCLE])
    job_id = f"redeliver-{topic.name[-8:]}"
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish_to(topic, lifecycle(job_id))

    first = await start_consumer(infra, topic.name, pg_dsn, topic.name, crash=True)
    assert await asyncio.wait_for(first.wait(), 60) == 17  # died where it would have committed

    db = await asyncpg.connect(pg_dsn)
    try:
        assert await db.fetchval("select n from deliveries") == 1
        second = await start_consumer(infra, topic.name, pg_dsn, topic.name, crash=False)
        await eventually(lambda: _deliveries_reach(db, 2), timeout_s=60)
        await asyncio.sleep(1.0)  # let it publish and commit
        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 30) == 0  # SIGTERM is a clean stop

        # A restart after the commit re-receives nothing: once it has handled a new record,
        # the first one has still been delivered twice only.
        third = await start_consumer(infra, topic.name, pg_dsn, topic.name, crash=False)
        first_event = await db.fetchval("select event_id from effects")
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish_to(topic, lifecycle(f"{job_id}-next"))
        await eventually(lambda: _effects_reach(db, 2), timeout_s=60)
        third.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(third.wait(), 30) == 0

        assert await db.fetchval("select n from deliveries where event_id = $1", first_event) == 2
        assert await db.fetchval("select count(*) from effects where job_id = $1", job_id) == 1
    finally:
        await db.close()
    outputs = [e for _, e in await read_all(infra.bootstrap_servers, JOBS_LIFECYCLE) if e.job_id == f"{job_id}-done"]  # type: ignore[attr-defined]
    assert len(outputs) == 2  # at-least-once: published by both runs ...
    assert len({e.event_id for e in outputs}) == 1  # ... as one event, which readers dedupe by id


async def _deliveries_reach(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("select max(n) from deliveries") == n


async def _effects_reach(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("select count(*) from effects") == n
