"""The dedupe rule on the real embedded broker (issue 28 item 4, `bus.runtime`'s module
docstring): a body forged under another key with the original's event id lands on another
partition; a service that reads the forgery first and one that reads the original first (the
same records produced in opposite orders) end with the same state, both keep the original, and
both dead-letter a second body of the id under the original's key."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hivemux.bus import RecordContext, Service, ensure_topics
from hivemux.bus.codec import encode_key, partition_for_key
from hivemux.events import JobLifecycleEvent, JobState
from hivemux.infra import Endpoints
from hivemux.settings import ServiceSettings

from support.buskit import AT, eventually, produce_raw, read_all, unique_topic

pytestmark = pytest.mark.integration

PARTITIONS = range(4)


def body(event_id: uuid.UUID, job_id: str, reason: str) -> JobLifecycleEvent:
    return JobLifecycleEvent(event_id=event_id, occurred_at=AT, source="test", job_id=job_id, state=JobState.WAITING, reason=reason)


async def consume(infra: Endpoints, order: list[JobLifecycleEvent]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """One service on a topic of its own, fed `order` one record at a time (each handled before
    the next is produced): what its handler folded, and its dead letters (job id, error type)."""
    topic = unique_topic(partitions=len(PARTITIONS))
    await ensure_topics(infra.bootstrap_servers, [topic])
    state: dict[str, str] = {}
    handled: list[str] = []

    def handler(event: JobLifecycleEvent, _: RecordContext) -> None:
        state[event.job_id] = event.reason
        handled.append(event.job_id)

    service = Service("dedupe-clash", ServiceSettings(KAFKA_BOOTSTRAP_SERVERS=infra.bootstrap_servers, HIVEMUX_GROUP_PREFIX=topic.name))
    service.on(topic, handler)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(service.ready.wait(), 30)
        for i, event in enumerate(order):
            await produce_raw(infra.bootstrap_servers, topic.name, encode_key(event.job_id), event.model_dump_json().encode())
            if i < len(order) - 1:  # the next is produced once this one was handled
                await eventually(lambda n=i + 1: asyncio.sleep(0, result=len(handled) >= n or None))
        letters = await eventually(lambda: _letters(infra, topic))
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)
    return state, letters


async def _letters(infra: Endpoints, topic) -> list[tuple[str, str]] | None:  # type: ignore[no-untyped-def]
    found = [event for _, event in await read_all(infra.bootstrap_servers, topic.dead_letter)]
    return sorted((f.key or "", f.error_type) for f in found) if found else None


async def test_consumers_reading_a_clash_in_opposite_orders_agree_and_keep_the_original(infra: Endpoints) -> None:
    event_id = uuid.uuid4()
    original = body(event_id, "job-a", "original")
    forged = next(body(event_id, f"job-{n}", "forged under another key") for n in range(100)
                  if partition_for_key(f"job-{n}", PARTITIONS) != partition_for_key("job-a", PARTITIONS))  # fmt: skip
    later = body(event_id, "job-a", "another body under the original's key")  # dead-lettered: same partition, later

    forgery_first = await consume(infra, [forged, original, later])
    original_first = await consume(infra, [original, forged, later])

    assert forgery_first == original_first
    state, letters = forgery_first
    assert state == {"job-a": "original", forged.job_id: "forged under another key"}
    assert letters == [("job-a", "ConflictingDuplicate")]
