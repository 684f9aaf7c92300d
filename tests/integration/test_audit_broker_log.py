"""The audit replay's `BrokerLog` on the embedded broker: a live log grows while it is read."""

from __future__ import annotations

import uuid

from support.buskit import lifecycle

from hivemux.audit import BrokerLog
from hivemux.bus import Publisher, ensure_topics
from hivemux.infra import Endpoints
from hivemux.topics import JOBS_LIFECYCLE, TOPICS


async def _publish(bootstrap: str, job_id: str, count: int) -> list[tuple[int, int]]:
    """`count` lifecycle steps of one job (one partition); their (partition, offset)."""
    async with Publisher(bootstrap, source="test") as publisher:
        sent = await publisher.publish_all([lifecycle(job_id, reason=f"step {i}") for i in range(count)])
    return [(m.partition, m.offset) for m in sent]


async def test_records_written_after_the_last_fetch_are_read(infra: Endpoints) -> None:
    """A fetch tells the partition's end as it was then; a range past it written since (a
    service still running during `hivemux audit replay`) is on the log and must be read. BrokerLog
    reads the registry's topics, on the session's shared broker: positions come from the sends."""
    await ensure_topics(infra.bootstrap_servers, TOPICS)
    job_id = f"log-{uuid.uuid4().hex[:8]}"
    first = await _publish(infra.bootstrap_servers, job_id, 3)
    partition, base = first[0]
    async with BrokerLog(infra.bootstrap_servers) as log:
        assert [r.offset for r in await log.read(JOBS_LIFECYCLE.name, partition, base, base + 2)] == [o for _, o in first]
        later = await _publish(infra.bootstrap_servers, job_id, 2)
        read = await log.read(JOBS_LIFECYCLE.name, partition, later[0][1], later[-1][1])
        assert [(r.partition, r.offset) for r in read] == later
        assert job_id.encode() in (read[0].value or b"")
        end = later[-1][1] + 1
        assert await log.read(JOBS_LIFECYCLE.name, partition, end, end) == []  # past the end: nothing, no waiting forever


async def test_a_topic_the_broker_does_not_have_holds_nothing(infra: Endpoints) -> None:
    """A topic a newer release declares may be missing on an older deployment's broker: reading
    it finds nothing rather than failing the replay."""
    async with BrokerLog(infra.bootstrap_servers) as log:
        assert await log.read(f"absent-{uuid.uuid4().hex[:8]}", 0, 0, 10) == []
