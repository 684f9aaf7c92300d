"""The audit replay's `ArchiveLog`: the embedded broker's log read from its archive in PostgreSQL,
and from the broker past what is archived, is the broker's log record for record."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from support.buskit import lifecycle

from hivemux.audit import ArchiveLog, BrokerLog
from hivemux.bus import Publisher, ensure_topics
from hivemux.infra import Endpoints
from hivemux.store.archive import archive, archived_positions
from hivemux.topics import JOBS_LIFECYCLE, TOPICS


async def _publish(bootstrap: str, job_id: str, count: int) -> list[tuple[int, int]]:
    async with Publisher(bootstrap, source="test") as publisher:
        sent = await publisher.publish_all([lifecycle(job_id, reason=f"step {i}") for i in range(count)])
    return [(m.partition, m.offset) for m in sent]


async def _archive_through(bootstrap: str, dsn: str, partition: int, offset: int) -> None:
    """Run the archiver until it holds `offset` of the lifecycle partition, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(archive(bootstrap, dsn, [JOBS_LIFECYCLE.name], stop=stop))
    try:
        for _ in range(300):
            await asyncio.sleep(0.05)
            conn = await asyncpg.connect(dsn)
            try:
                if (await archived_positions(conn)).get((JOBS_LIFECYCLE.name, partition), 0) > offset:
                    return
            except asyncpg.UndefinedTableError:
                pass
            finally:
                await conn.close()
        raise AssertionError("the archiver did not catch up")
    finally:
        stop.set()
        await task


def _rows(records):  # type: ignore[no-untyped-def]
    return [(r.topic, r.partition, r.offset, r.key, r.value) for r in records]


async def test_archive_then_broker_tail_reads_as_the_broker(infra: Endpoints, pg_dsn: str) -> None:
    await ensure_topics(infra.bootstrap_servers, TOPICS)
    job_id = f"alog-{uuid.uuid4().hex[:8]}"
    archived = await _publish(infra.bootstrap_servers, job_id, 30)
    partition, first = archived[0]
    await _archive_through(infra.bootstrap_servers, pg_dsn, partition, archived[-1][1])
    tail = await _publish(infra.bootstrap_servers, job_id, 20)  # on the broker only
    last = tail[-1][1]
    async with BrokerLog(infra.bootstrap_servers) as broker:
        expected = await broker.read(JOBS_LIFECYCLE.name, partition, first, last)
        scanned = await broker.scan([JOBS_LIFECYCLE.name])
    assert len(expected) == 50
    async with ArchiveLog(pg_dsn, BrokerLog(infra.bootstrap_servers)) as log:
        # Forward in small ranges (a journal's), across the archive's end, then back (a new incarnation).
        pieces = []
        for start in range(first, last + 1, 7):
            pieces += await log.read(JOBS_LIFECYCLE.name, partition, start, min(last, start + 6))
        assert _rows(pieces) == _rows(expected)
        assert _rows(await log.read(JOBS_LIFECYCLE.name, partition, first + 3, first + 40)) == _rows(expected[3:41])
        assert _rows(await log.scan([JOBS_LIFECYCLE.name])) == _rows(scanned)
        assert await log.read(JOBS_LIFECYCLE.name, partition, last + 1, last + 5) == []
    async with ArchiveLog(pg_dsn) as alone:  # a stopped system's history: the archive only
        assert _rows(await alone.read(JOBS_LIFECYCLE.name, partition, first, last)) == _rows(expected[:30])


async def test_a_database_without_an_archive_is_refused(pg_dsn: str) -> None:
    with pytest.raises(LookupError, match="no archive"):
        async with ArchiveLog(pg_dsn):
            pass
